"""DeviceActor: the stable address of one device."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from atomr_accel.actor import (
    Actor,
    ActorInitializationError,
    ActorRef,
    Directive,
    OneForOneStrategy,
    Props,
    Reply,
    StashOverflow,
    Terminated,
)
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    QueueFull,
    SystemClosed,
    Unrecoverable,
)
from atomr_accel.core._op import Op
from atomr_accel.device._config import DeviceConfig
from atomr_accel.device._context import ContextActor
from atomr_accel.device._lane import Gate, prepare
from atomr_accel.device._messages import (
    ContextDown,
    ContextReady,
    GenerationChanged,
    GetStats,
    Redispatch,
    Run,
    WatchGeneration,
)
from atomr_accel.device._replay import Compact, DeviceRecorder, MarkDurable, Recovered
from atomr_accel.device._standby import Standby
from atomr_accel.device._state import DeviceState, DeviceStats, Status
from atomr_accel.device._supervision import device_decider

__all__ = ["DeviceActor"]

_log = logging.getLogger("atomr_accel.device")


class DeviceActor(Actor):
    """One device: ask it any op (``await device.ask(Gemm(...))``) and get the result.

    Validates each op, routes it to the kernel actor of its library (memory ops
    to the context actor), and stashes requests while the context is (re)built,
    draining them in order when it is ready (``QueueFull`` past
    ``stash_capacity``). It supervises the ``ContextActor`` with the device
    decider and the restart budget; once the context stops for good every
    queued and later request fails at once with ``Unrecoverable``. With a
    journal (``config.journal``) it records completed ops and, after a rebuild,
    re-materializes durable buffers (``MarkDurable``) before it drains the stash;
    a journal that cannot be used stops it at once (``InvalidArgument``, the
    answer to every request).
    """

    @classmethod
    def props(cls, config: DeviceConfig, state: DeviceState | None = None) -> Props:
        """Props for a device actor with the config's stash capacity."""
        return Props(cls, config, state).with_stash_capacity(config.stash_capacity)

    def __init__(self, config: DeviceConfig, state: DeviceState | None = None) -> None:
        self.config = config
        self.state = state or DeviceState(config.device_id)
        self.supervisor_strategy = OneForOneStrategy(
            max_restarts=config.max_restarts, within=config.within, decider=self._decide
        )
        self.failure: BaseException | None = None
        """The context's last failure (what a stop reports as its cause)."""
        self.routes: dict[str, ActorRef] = {}
        self.watchers: list[ActorRef] = []
        self.stopped_error: GpuRuntimeError | None = None
        self.recovery: asyncio.Task[None] | None = None
        self.compaction: asyncio.Task[None] | None = None
        self.confirming: set[asyncio.Task[None]] = set()
        """``MarkDurable`` answers waiting for the journal to store the buffer's history."""
        self.restarting = False
        self.gate: Gate | None = None
        """The data plane's way to the current context generation, opened once it serves."""
        self.state.lane.path = self.context.self_ref.path
        self.state.device = self.context.self_ref
        self.state.status = Status.STARTING
        self.context_ref: ActorRef | None = None
        self.reruns_told = 0
        """``state.reruns`` as last logged."""
        self.switches_told = 0
        """The standby's switches as last told to watchers."""

    async def pre_start(self) -> None:
        """Open the journal (if the config names one), then start the context."""
        journal = self.config.journal
        if journal is not None and self.state.recorder is None:
            try:
                self.state.recorder = await DeviceRecorder.open_async(journal, self.state)
            except GpuRuntimeError as exc:
                self.state.start_error = exc
                self._stop_serving()
                return
        if self.config.standby and self.state.standby is None:
            self.state.standby = Standby(self.config.make_host, self.state.functions.warm)
        props = Props(ContextActor, self.config, self.state)
        self.context_ref = self.context.watch(self.context.spawn(props, "context"))

    async def receive(self, message: Any) -> Any:
        """Handle ops, context lifecycle messages, generation watches and stats."""
        if isinstance(message, Op):
            self._submit(message)
        elif isinstance(message, ContextReady):
            if message.generation == self.state.generation:
                self.routes = message.routes
                self.gate = message.gate
                recorder = self.state.recorder
                if recorder is not None and recorder.durable:  # durable buffers come back first
                    self.state.status = Status.REBUILDING
                    self.recovery = recorder.start_recovery(
                        self.state, self.routes, message.generation, self.context.self_ref)
                else:
                    self._serve(message.generation)
        elif isinstance(message, Recovered):
            self._recovered(message)
        elif isinstance(message, MarkDurable):
            self._mark_durable(message)
        elif isinstance(message, Compact):
            self._compact()
        elif isinstance(message, ContextDown):
            if message.generation == self.state.generation:
                self._cancel_recovery()
                self._cancel_compaction()
                self.state.lane.close(message.generation)
                self.state.status = Status.REBUILDING
                self.routes = {}
                self.gate = None
                self._log_event(logging.WARNING, "context_down",
                                "context generation %d went down",
                                message.generation)
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
        elif isinstance(message, Redispatch):
            with self.state.lock:
                self.state.redispatch_asked = False
            if self.state.status is Status.READY:  # else the next context takes them
                self._dispatch_unlaunched()
        else:
            raise TypeError(f"a device does not handle {message!r}")
        return None

    def _serve(self, generation: int) -> None:
        """The context of ``generation`` is up (and durable buffers whole): run what waits."""
        self.state.status = Status.READY
        self._log_event(logging.INFO, "context_ready", "context generation %d is up", generation)
        reran, self.reruns_told = self.state.reruns - self.reruns_told, self.state.reruns
        if reran:
            self._log_event(logging.INFO, "ops_rerun", "generation %d runs again %d op(s) "
                            "the last context died under", generation, reran)
        standby, standby_ms = self.state.standby, None
        if standby is not None and standby.switches != self.switches_told:
            self.switches_told, standby_ms = standby.switches, standby.last_switch_ms
        recorder = self.state.recorder
        if recorder is not None:
            recorder.serve(generation)
        self._dispatch_unlaunched()
        self.context.unstash_all()
        if self.gate is not None and self.gate.generation == generation:
            self.state.lane.open(self.gate)  # takes nothing while what was queued is in flight
        changed = GenerationChanged(self.config.device_id, generation, standby_ms, reran)
        for watcher in self.watchers:
            watcher.tell(changed)

    def _dispatch_unlaunched(self) -> None:
        """Send the requests not launched yet (queued in old mailboxes, held during a
        recovery, handed back by a host that never ran them) to the current context."""
        recorder = self.state.recorder
        for pending in self.state.unlaunched():
            if recorder is not None:
                pending.op = recorder.refresh(pending.op)
            self.routes[pending.op.library].tell(Run(pending.op, pending))

    def _recovered(self, message: Recovered) -> None:
        if self.recovery is None or message.generation != self.state.generation:
            return  # the recovery of a context that has gone down since
        self._cancel_recovery()
        if message.error is not None:
            if isinstance(message.error, ContextPoisoned | Unrecoverable):
                return  # this context went down too: the next one recovers, or none will
            assert self.state.recorder is not None
            self.state.recorder.give_up(message.error)
        self._serve(message.generation)

    def _cancel_recovery(self) -> None:
        if self.recovery is not None:
            self.recovery.cancel()
            self.recovery = None

    def _compact(self) -> None:
        recorder = self.state.recorder
        assert recorder is not None
        if self.compaction is not None:
            return
        if self.state.status is not Status.READY:
            recorder.compaction_asked = False  # the next write past the bound asks again
            return
        self.compaction = recorder.start_compaction(self.state, self.routes)
        self.compaction.add_done_callback(self._compaction_done)

    def _compaction_done(self, task: asyncio.Task[None]) -> None:
        if self.compaction is task:
            self.compaction = None

    def _cancel_compaction(self) -> None:
        if self.compaction is not None:
            self.compaction.cancel()
            self.compaction = None
            if self.state.recorder is not None:
                self.state.recorder.compaction_asked = False

    def _mark_durable(self, message: MarkDurable) -> None:
        reply = self.context.defer_reply()
        recorder = self.state.recorder
        try:
            if self.stopped_error is not None:
                raise self.stopped_error
            if recorder is None:
                raise InvalidArgument(
                    "durable buffers need a journal: spawn the device with journal=...")
            if self.state.status is Status.READY:
                recorder.mark_durable(message, self.state)
                task = asyncio.get_running_loop().create_task(self._confirm(reply))
                self.confirming.add(task)
                task.add_done_callback(self.confirming.discard)
            else:
                self._stash(reply)
        except GpuRuntimeError as exc:
            reply.set_exception(exc)

    async def _confirm(self, reply: Reply) -> None:
        """Answer a ``MarkDurable`` once the journal has stored the buffer's history so far:
        a journal that cannot store it fails the mark (``LibraryError``)."""
        recorder = self.state.recorder
        assert recorder is not None
        try:
            await recorder.journal.flush_async()
        except GpuRuntimeError as exc:
            reply.set_exception(exc)
        else:
            reply.set_result(None)

    def _stash(self, reply: Reply) -> None:
        try:
            self.context.stash()
        except StashOverflow:
            reply.set_exception(QueueFull(self.config.device_id, self.config.stash_capacity))

    def _submit(self, op: Op) -> None:
        reply = self.context.defer_reply()
        if self.stopped_error is not None:
            reply.set_exception(self.stopped_error)
            return
        try:
            op = prepare(op, self.state)
            if op.library != "memory" and op.library not in self.config.libraries:
                raise InvalidArgument(
                    f"library {op.library!r} is not enabled on device {self.config.device_id} "
                    f"(enabled: {', '.join(self.config.libraries)})"
                )
        except GpuRuntimeError as exc:
            reply.set_exception(exc)
            return
        if self.state.status is not Status.READY:
            self._stash(reply)
            return
        pending = self.state.track(op, reply)
        reply.when_abandoned(pending.abandon)  # its asker cancelled or timed out
        self.routes[op.library].tell(Run(op, pending))

    def _decide(self, exc: BaseException) -> Directive:
        """The device decider, remembering the failure (the cause a stop reports)."""
        self.failure = exc.cause if isinstance(exc, ActorInitializationError) else exc
        return device_decider(exc)

    def _stop_serving(self) -> None:
        self._cancel_recovery()
        state = self.state
        state.lane.close()
        state.status = Status.STOPPED
        self.routes = {}
        self.stopped_error = self._stopped_error()
        self._log_event(logging.ERROR, "device_stopped", "stopped: %s", self.stopped_error)
        state.fail_all(self.stopped_error)
        self.context.unstash_all()  # each stashed request is now refused at once

    def _stopped_error(self) -> GpuRuntimeError:
        """What every request gets once the context has stopped for good, saying why."""
        system, start_error, failure = self.context.system, self.state.start_error, self.failure
        if system.is_terminated:
            return SystemClosed(system.name, "device call")
        if isinstance(start_error, GpuRuntimeError):
            return start_error  # e.g. DeviceUnavailable: say why
        config, restarts = self.config, self.state.restarts
        if start_error is not None:
            failure = start_error
            why = f"its context could not start: {start_error!r}"
        elif failure is None:
            why = "its context stopped"
        elif device_decider(failure) is Directive.RESTART:  # a restart past the budget
            why = (f"its context failed after {restarts} restart{'s' * (restarts != 1)}, and "
                   f"the restart budget {config.max_restarts} in {config.within:g} s is "
                   f"spent: {failure}")
        else:
            why = str(failure)
        error = Unrecoverable(f"device {config.device_id} has stopped: {why}")
        error.__cause__ = failure
        return error

    def stats(self) -> DeviceStats:
        """A snapshot of this device (never waits: memory figures are the cached reading)."""
        state = self.state
        memory_free, memory_total = state.memory
        journal = None if state.recorder is None else state.recorder.journal
        error = None if journal is None else journal.error
        return DeviceStats(
            device_id=self.config.device_id, backend=self.config.backend,
            isolation=self.config.isolation, status=state.status, generation=state.generation,
            restarts=state.restarts, in_flight=state.in_flight,
            queue_depth=self.context.stash_size, completed=state.completed,
            failed=state.failed, out_of_memory=state.out_of_memory, host_pid=state.host_pid,
            bytes_allocated=state.bytes_allocated, memory_free=memory_free,
            memory_total=memory_total,
            journal_healthy=None if journal is None else error is None,
            journal_error=None if error is None else str(error),
            active_streams=len(self.config.libraries) if self.config.capabilities.library_streams
            else 0,
            compute_capability=state.capability,
            standby_ready=None if state.standby is None else state.standby.ready,
            standby_pid=None if state.standby is None else state.standby.pid,
            standby_switches=0 if state.standby is None else state.standby.switches,
            standby_switch_ms=None if state.standby is None else state.standby.last_switch_ms,
            reruns=state.reruns,
            functions=state.functions.snapshot(),
        )

    def _log_event(self, level: int, event: str, message: str, *args: Any) -> None:
        """Log a lifecycle event on ``atomr_accel.device`` with structured fields."""
        state = self.state
        _log.log(level, "device %s: " + message, state.name, *args, extra={
            "event": event, "device": state.name, "device_id": state.device_id,
            "generation": state.generation, "restarts": state.restarts,
            "status": state.status.value})

    async def pre_restart(self, exc: BaseException, message: Any) -> None:
        """Fail every request in flight with the error that restarts this device."""
        self.restarting = True
        self.state.lane.close()
        self.state.fail_all(exc)
        await super().pre_restart(exc, message)

    async def post_stop(self) -> None:
        """Stop a recovery or compaction in progress, fail what is still in flight and every
        request a host hands back later (``SystemClosed`` when the system closes); close the
        journal unless this actor restarts."""
        self._cancel_recovery()
        self._cancel_compaction()
        if not self.restarting:
            self.state.shut(self.stopped_error or self._stopped_error())
            if self.state.standby is not None:
                await self.state.standby.close()
        if not self.restarting and self.state.recorder is not None:
            await self.state.recorder.close_async()
