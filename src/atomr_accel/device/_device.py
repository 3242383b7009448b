"""DeviceActor: the stable address of one device."""

from __future__ import annotations

from typing import Any

from atomr_accel.actor import (
    Actor,
    ActorRef,
    OneForOneStrategy,
    Props,
    StashOverflow,
    Terminated,
)
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, QueueFull, Unrecoverable
from atomr_accel.core._op import Op
from atomr_accel.device._config import DeviceConfig
from atomr_accel.device._context import ContextActor
from atomr_accel.device._messages import (
    ContextDown,
    ContextReady,
    GenerationChanged,
    GetStats,
    Run,
    WatchGeneration,
)
from atomr_accel.device._state import DeviceState, DeviceStats, Status
from atomr_accel.device._supervision import device_decider

__all__ = ["DeviceActor"]


class DeviceActor(Actor):
    """One device: ask it any op (``await device.ask(Gemm(...))``) and get the result.

    Validates each op, routes it to the kernel actor of its library (memory ops
    to the context actor), and stashes requests while the context is (re)built,
    draining them in order when it is ready (``QueueFull`` past
    ``stash_capacity``). It supervises the ``ContextActor`` with the device
    decider and the restart budget; once the context stops for good every
    queued and later request fails at once with ``Unrecoverable``.
    """

    @classmethod
    def props(cls, config: DeviceConfig, state: DeviceState | None = None) -> Props:
        """Props for a device actor with the config's stash capacity."""
        return Props(cls, config, state).with_stash_capacity(config.stash_capacity)

    def __init__(self, config: DeviceConfig, state: DeviceState | None = None) -> None:
        self.config = config
        self.state = state or DeviceState(config.device_id)
        self.supervisor_strategy = OneForOneStrategy(
            max_restarts=config.max_restarts, within=config.within, decider=device_decider
        )
        self.routes: dict[str, ActorRef] = {}
        self.watchers: list[ActorRef] = []
        self.stopped_error: GpuRuntimeError | None = None
        self.state.status = Status.STARTING
        props = Props(ContextActor, config, self.state)
        self.context_ref = self.context.watch(self.context.spawn(props, "context"))

    async def receive(self, message: Any) -> Any:
        """Handle ops, context lifecycle messages, generation watches and stats."""
        if isinstance(message, Op):
            self._submit(message)
        elif isinstance(message, ContextReady):
            if message.generation == self.state.generation:
                self.routes = message.routes
                self.state.status = Status.READY
                for pending in self.state.unlaunched():  # queued in the old actors' mailboxes
                    self.routes[pending.op.library].tell(Run(pending.op, pending))
                self.context.unstash_all()
                for watcher in self.watchers:
                    watcher.tell(GenerationChanged(self.config.device_id, message.generation))
        elif isinstance(message, ContextDown):
            if message.generation == self.state.generation:
                self.state.status = Status.REBUILDING
                self.routes = {}
        elif isinstance(message, Terminated):
            if message.ref is self.context_ref:  # not a context of an earlier incarnation
                self._stop_serving()
        elif isinstance(message, WatchGeneration):
            if message.unwatch:
                self.watchers = [w for w in self.watchers if w is not message.subscriber]
            elif message.subscriber not in self.watchers:
                self.watchers.append(message.subscriber)
                if self.state.status is Status.READY:
                    message.subscriber.tell(
                        GenerationChanged(self.config.device_id, self.state.generation))
        elif isinstance(message, GetStats):
            return self.stats()
        else:
            raise TypeError(f"a device does not handle {message!r}")
        return None

    def _submit(self, op: Op) -> None:
        reply = self.context.defer_reply()
        if self.stopped_error is not None:
            reply.set_exception(self.stopped_error)
            return
        try:
            op.validate()
            if op.library != "memory" and op.library not in self.config.libraries:
                raise InvalidArgument(
                    f"library {op.library!r} is not enabled on device {self.config.device_id} "
                    f"(enabled: {', '.join(self.config.libraries)})"
                )
        except GpuRuntimeError as exc:
            reply.set_exception(exc)
            return
        except Exception as exc:  # a malformed op (wrong field types) is bad input too
            error = InvalidArgument(f"invalid {type(op).__name__}: {exc}")
            error.__cause__ = exc
            reply.set_exception(error)
            return
        if self.state.status is not Status.READY:
            try:
                self.context.stash()
            except StashOverflow:
                reply.set_exception(QueueFull(self.config.device_id, self.config.stash_capacity))
            return
        self.routes[op.library].tell(Run(op, self.state.track(op, reply)))

    def _stop_serving(self) -> None:
        state = self.state
        state.status = Status.STOPPED
        self.routes = {}
        if isinstance(state.start_error, GpuRuntimeError):
            self.stopped_error = state.start_error  # e.g. DeviceUnavailable: say why
        else:
            self.stopped_error = Unrecoverable(
                f"device {self.config.device_id} has stopped (context restarted "
                f"{state.restarts} times; budget {self.config.max_restarts} in "
                f"{self.config.within:g} s)"
            )
        state.fail_all(self.stopped_error)
        self.context.unstash_all()  # each stashed request is now refused at once

    def stats(self) -> DeviceStats:
        """A snapshot of this device."""
        state = self.state
        return DeviceStats(
            device_id=self.config.device_id, backend=self.config.backend,
            isolation=self.config.isolation, status=state.status, generation=state.generation,
            restarts=state.restarts, in_flight=len(state.pending),
            queue_depth=self.context.stash_size, completed=state.completed,
            failed=state.failed, out_of_memory=state.out_of_memory, host_pid=state.host_pid,
        )

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Fail every request in flight with the error that restarts this device."""
        self.state.fail_all(exc)
        await super().pre_restart(exc, message)
