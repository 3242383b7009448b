"""ContextActor: owns one context generation (its host) and the kernel actors on it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from atomr_accel.actor import Actor, Directive, OneForOneStrategy, Props
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    SystemClosed,
    Unrecoverable,
    WorkerLost,
)
from atomr_accel.device._config import DeviceConfig
from atomr_accel.device._kernels import actor_class, launch
from atomr_accel.device._lane import Gate
from atomr_accel.device._messages import ContextDown, ContextReady, Fatal, Run
from atomr_accel.device._state import DeviceState
from atomr_accel.hosts._base import ContextHost

__all__ = ["ContextActor"]

_log = logging.getLogger(__name__)


class ContextActor(Actor):
    """One context generation: starts the host, spawns a kernel actor per library,
    runs memory ops itself, and fails when an op's error ends the generation.

    Supervised by the device actor, which restarts it on ``ContextPoisoned``
    (a fresh host, the generation one higher) and stops it on ``Unrecoverable``.
    """

    supervisor_strategy = OneForOneStrategy(decider=lambda exc: Directive.ESCALATE)

    def __init__(self, config: DeviceConfig, state: DeviceState) -> None:
        self.config = config
        self.state = state
        self.generation = 0
        self.host: ContextHost | None = None
        self.failure: GpuRuntimeError | None = None
        self.restarting = False

    async def pre_start(self) -> None:
        """Start a host for a new generation and announce it to the device."""
        state = self.state
        state.generation += 1
        self.generation = state.generation
        standby = state.standby
        host = None if standby is None else await standby.take()
        if host is None:
            host = self.config.make_host()
            try:
                await host.start()
            except BaseException as exc:
                state.start_error = exc
                await host.close()
                raise
        elif standby is not None and self.generation > 1:
            waited = standby.last_switch_ms or 0.0
            _log.info("device %s: generation %d runs on the standby context (waited %.1f ms)",
                      state.name, self.generation, waited, extra={
                          "event": "standby_switch", "device": state.name,
                          "generation": self.generation, "ms": waited})
        if standby is not None:
            standby.replenish()
        state.start_error = None
        await state.functions.build_all(host, self.generation)  # residents, before any call
        state.host_pid = host.pid
        state.host_node = getattr(host, "node_id", None)
        self.host = host
        me = self.context.self_ref
        generation = self.generation

        def died(fut: asyncio.Future[GpuRuntimeError]) -> None:
            if not fut.cancelled():  # the data plane takes nothing more; supervision acts
                state.lane.close(generation)
                _forget_pid(state, generation)
                me.tell(Fatal(fut.result(), generation))

        assert host.died is not None
        host.died.add_done_callback(died)
        routes = {"memory": me}
        streams = {"memory": 0}
        for library in self.config.libraries:
            stream = streams[library] = self.config.streams.stream_for(library)
            props = Props(actor_class(library), host, generation, state, me, stream)
            routes[library] = self.context.spawn(props, library)
        parent = self.context.parent
        assert parent is not None
        parent.tell(ContextReady(generation, routes, Gate(host, generation, streams, me)))

    async def receive(self, message: Any) -> None:
        """Run memory ops; turn the first fatal error of this generation into a failure."""
        if isinstance(message, Run):
            assert self.host is not None
            launch(message.op, message.pending, self.host, self.generation, self.state,
                   self.context.self_ref)
        elif isinstance(message, Fatal):
            if message.generation != self.generation or self.failure is not None:
                return  # a later report of a failure already handled
            self.failure = message.error
            parent = self.context.parent
            assert parent is not None
            parent.tell(ContextDown(self.generation))
            raise message.error
        else:
            raise TypeError(f"ContextActor does not handle {message!r}")

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Tear this generation down (kernel actors, host) before the next one starts."""
        self.restarting = True
        await super().pre_restart(exc, message)
        self.state.restarts += 1

    async def post_stop(self) -> None:
        """Fail what this generation still owes, then close its host."""
        failure, device = self.failure, self.state.device_id
        system = self.context.system
        error: GpuRuntimeError
        if self.restarting or isinstance(failure, ContextPoisoned):
            lost = isinstance(failure, WorkerLost)  # its ops are owed the same word
            error = (WorkerLost if lost else ContextPoisoned)(
                f"context generation {self.generation} of device {device} went down "
                + ("(its worker died) " if lost else "") + "before this op finished"
            )
        elif failure is None and system.is_terminated:
            error = SystemClosed(system.name, "the op in flight")
        else:
            error = Unrecoverable(f"device {device} stopped" + (f": {failure}" if failure else ""))
        error.__cause__ = failure
        self.state.lane.close(self.generation)
        self.state.fail_launched(self.generation, error, rerun=isinstance(error, ContextPoisoned))
        if self.host is not None:
            _forget_pid(self.state, self.generation)
            await self.host.close()
            self.host = None


def _forget_pid(state: DeviceState, generation: int) -> None:
    """The host of ``generation`` died or is closing: unless a later generation is up,
    name no process until the next host names its own."""
    if state.generation == generation:
        state.host_pid = None
