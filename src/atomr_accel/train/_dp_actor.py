"""The actor behind ``DataParallelTrainer``: replicas on devices, the bucketed gradient
all-reduce, and the recovery of a replica whose context died mid-step.

A step (``_attempt``) runs in four phases, with one read-back a replica.
*Backward*: every replica zeroes its gradients and its step stats (a device buffer
``[loss_sum, grad_sumsq, apply_flag]``) and runs forward, loss and backward on its
share of the global batch (micro-batch by micro-batch, accumulating), each loss
gradient scaled by its rows' share of the global batch and ``rows * loss`` added into
``loss_sum`` on the device; all submitted at once, nothing read back. *Reduce*:
bucket by bucket, in the order backward fills them (last layer first), as soon as
every replica has submitted the ops that complete a bucket, the world all-reduces
(sums) it, while backward still fills the next buckets; the last bucket's launch
also sums the stats, so every replica holds the global loss sum. *Check*: each
replica computes on its device the summed gradient's sum of squares and the flag
(loss and norm finite). *Update*: the same optimizer step, gated on that flag on the
device, then the stats' download, the step's one read-back. Check and update are
submitted together once backward (and the reduce) has finished, so that an op of the
first half that failed leaves nothing applied.
Every replica holds the same stats and gradients, so all apply the same update
(the parameters stay identical) or none does: then the step raises
``InvalidArgument`` and every replica is as before it (step count included).

When a step fails because a replica's context went down (``ContextPoisoned``,
a killed worker, the collective that aborted with it), ``_recover`` waits for
the devices to serve again, rebuilds the replicas whose buffers died, copies
into them the whole state (parameters, optimizer state, step) of a healthy
replica, or, with none left, of the last host checkpoint followed by a replay of
the batches trained since, and the step runs again. A step whose update had
already been applied by a healthy replica is not run again: the rebuilt
replicas take that replica's updated state.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from atomr_accel.backends import cuda_device_count
from atomr_accel.blueprint import BlueprintActor
from atomr_accel.core._errors import (
    ContextPoisoned,
    GpuRuntimeError,
    InvalidArgument,
    Unrecoverable,
)
from atomr_accel.facade import Collective, Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._dp_ledger import Ledger, ReplicaRecovered, TrainerStats
from atomr_accel.train._dp_replica import MicroBatch, Slot
from atomr_accel.train._dp_spec import TrainerSpec
from atomr_accel.train._dp_split import plan_shares, require_width
from atomr_accel.train._model import Array
from atomr_accel.train._recovery import RECOVERABLE, settled_generation
from atomr_accel.train._replica_state import Thunk, gather, start_now
from atomr_accel.train._step_result import StepResult

__all__ = [
    "DataParallelActor", "Evaluate", "LoadState", "Predict", "Ready", "ReplicaStates",
    "StateDict", "Stats", "Step",
]

T = TypeVar("T")
REBUILD_TIMEOUT = 120.0
"""Seconds a recovery waits for a device's context to come back."""
SETTLED = 3
"""After this many steps a trainer's set-up is over: its replicas are built, their kernels
compiled and their repeated runs of ops recorded as graphs (on CUDA, a run's second
time; the update's differs in its first step). The trainer then runs a full garbage
collection, as it did once its replicas were built, so that the collection which the
set-up's survivors would trigger later, pausing every thread of the process for tens
of milliseconds (45-73 ms on a 2 x H200 machine), does not land mid-training."""


@dataclass(frozen=True, slots=True)
class Ready:
    """Build the devices, the world and the replicas (if not yet); answer None."""


@dataclass(frozen=True, slots=True)
class Step:
    """Train one step on rows ``x`` and targets ``y`` (None: each row's sum, the original
    form's model); both already checked by the client."""

    x: Array
    y: Array | None


@dataclass(frozen=True, slots=True)
class Predict:
    """The model's outputs on rows ``x`` (checked by the client)."""

    x: Array


@dataclass(frozen=True, slots=True)
class Evaluate:
    """Loss (and accuracy for classification) on ``(x, y)`` (checked by the client)."""

    x: Array
    y: Array


@dataclass(frozen=True, slots=True)
class StateDict:
    """The whole state of replica 0 (all replicas hold the same)."""


@dataclass(frozen=True, slots=True)
class ReplicaStates:
    """Every replica's whole state, in replica order."""


@dataclass(frozen=True, slots=True)
class LoadState:
    """Load ``state`` into every replica (and keep it as the checkpoint)."""

    state: dict[str, Array]


@dataclass(frozen=True, slots=True)
class Stats:
    """A ``TrainerStats`` snapshot."""


class DataParallelActor(BlueprintActor):
    """One replica per device, the gradient all-reduce, recovery (see the module doc)."""

    def __init__(self, system: System, spec: TrainerSpec, ledger: Ledger) -> None:
        super().__init__()
        self.system = system
        self.spec = spec
        self.ledger = ledger
        self.devices: list[Device] = []
        self._spawned: list[Device] = []
        self.world: Collective | None = None
        self.slots: list[Slot] = []
        self.features: int | None = None
        self._done_step = (0.0, 0.0)
        self._unsettled = False
        """A step failed of a lost context: the next call heals first, even where the
        device has not yet counted the rebuild (its generation goes up when it starts)."""

    # ------------------------------------------------------------------ messages

    async def handle(self, message: Any) -> Any:
        """Serve one request (the message classes above)."""
        if isinstance(message, Ready):
            await self._devices()
            if self.spec.model is not None:
                await self._replicas(None)
            return None
        if isinstance(message, Step):
            return await self._step(message.x, message.y)
        if isinstance(message, Predict):
            return await self._predict(message.x)
        if isinstance(message, Evaluate):
            return await self._evaluate(message.x, message.y)
        if isinstance(message, StateDict):
            await self._require_model()
            return await self._guarded(self._first_state)
        if isinstance(message, ReplicaStates):
            await self._require_model()
            await self._heal_between_steps()
            return list(await asyncio.gather(*(s.replica.state_dict_async()
                                               for s in self.slots)))
        if isinstance(message, LoadState):
            return await self._load(message.state)
        if isinstance(message, Stats):
            return self._stats()
        return await super().handle(message)

    # ------------------------------------------------------------------ set-up

    async def _devices(self) -> None:
        """The devices (given or spawned) and, with several, their world."""
        if self.devices:
            return
        spec = self.spec
        if spec.devices is not None:
            devices = list(spec.devices)
        else:  # kept as they come up: a failed attempt does not spawn them twice
            spawned = self._spawned
            mock = spec.mock
            if mock is None:  # GPUs where the machine has one a replica, else CPU devices
                mock = cuda_device_count() < spec.n_replicas
            while len(spawned) < spec.n_replicas:
                spawned.append(await self.system.spawn_device_async(
                    len(spawned), mock=mock, isolation=spec.isolation_mode,
                    standby=spec.standby))
            devices = list(spawned)
        if len(devices) > 1 and self.world is None:
            self.world = await self.system.nccl_world_async(devices)
        self.devices = devices

    async def _replicas(self, features: int | None) -> None:
        """Build one replica a device, all with the same initial state."""
        if self.slots:
            return
        await self._devices()
        model = self.spec.model_for(features)
        self.features = self.spec.features_of(model)
        self.slots = list(await asyncio.gather(*(self._build(d) for d in self.devices)))
        gc.collect()  # the replicas' set-up's garbage (see ``SETTLED``)
        if self.ledger.steps:  # a restarted incarnation: go back to where the last one was
            await self._rewind("actor restart")

    async def _build(self, device: Device) -> Slot:
        generation = device.generation
        replica = await self.spec.create_replica(device, self.spec.model_for(self.features),
                                                 self.devices.index(device))
        return Slot(device, replica, generation)

    async def _require_model(self) -> None:
        await self._devices()
        if self.spec.model is None and not self.slots:
            raise InvalidArgument("the trainer's model takes its width from the first batch: "
                                  "call step() first")
        await self._replicas(None)

    # ------------------------------------------------------------------ the step

    async def _step(self, xs: Array, y: Array | None) -> StepResult:
        """One trainer step over rows ``xs`` (checked by the client) and targets ``y``
        (None: each row's sum, the original form's model)."""
        started = time.perf_counter()
        with np.errstate(all="ignore"):  # inf - inf in a row: a NaN target, refused below
            ys = xs.reshape(len(xs), -1).sum(axis=1, keepdims=True) if y is None else y
        await self._devices()
        await self._replicas(int(np.prod(xs.shape[1:])))
        require_width(xs, self.features)
        recovered = 0
        attempts = 0
        while True:
            recovered += await self._heal_between_steps()
            stepped: set[int] = set()
            try:
                loss, norm = await self._attempt(xs, ys, stepped)
                break
            except GpuRuntimeError as exc:
                attempts += 1
                retry = isinstance(exc, RECOVERABLE) and attempts <= self.spec.max_retries
                if len(stepped) == len(self.slots):  # every replica applied it: it stands
                    loss, norm = self._done_step  # (a lost context heals next call)
                    break
                if not retry and not stepped:
                    self._unsettled = isinstance(exc, RECOVERABLE)
                    raise  # nothing was applied: the replicas agree
                rebuilt, done = await self._recover(exc, stepped)
                recovered += rebuilt
                if done:  # a healthy replica had applied it: the others took its state
                    loss, norm = self._done_step
                    break
                if not retry:
                    raise
                self.ledger.redone_steps += 1
        self.ledger.record(xs, ys, loss)
        if self.ledger.steps == SETTLED:
            gc.collect()
        if self.ledger.due():
            self.ledger.keep(await self.slots[0].replica.state_dict_async())
        micros = int((time.perf_counter() - started) * 1e6)
        return StepResult(loss, norm, micros, recovered)

    async def _attempt(self, xs: Array, ys: Array, stepped: set[int]) -> tuple[float, float]:
        """One step over every replica (module doc); ``stepped`` collects the replicas
        whose update was applied. Answers (loss, global gradient norm)."""
        slots, total = self.slots, len(xs)
        shares = plan_shares(total, len(slots), self.spec.micro_batch)
        loop = asyncio.get_running_loop()
        count = len(slots[0].replica.gradient_buckets)
        ready = [[loop.create_future() for _ in range(count)] for _ in slots]
        # Each replica's first half is on its way before the next one's calls are made.
        # It is awaited before the second half is submitted, with one replica too: an op
        # of it that failed (a handler's error) then leaves nothing applied.
        work: list[asyncio.Future[Any]] = []
        try:
            for slot, share, marks in zip(slots, shares, ready, strict=True):
                calls = await slot.replica.gradient_phase_ops(
                    [MicroBatch(xs[a:b], ys[a:b], (b - a) / total) for a, b in share.chunks],
                    bucket_ready=partial(_mark, marks))
                work.append(start_now(gather(calls)))
            if self.world is not None:
                work.append(start_now(self._reduce(ready)))
        except BaseException:
            await _cancel_all(work)
            raise
        await _all_or_first_error(work)
        finishing = [self._finish(i, slot.replica.finish_step_ops(), stepped)
                     for i, slot in enumerate(slots)]
        results = await asyncio.gather(*finishing, return_exceptions=True)
        done = [r for r in results if not isinstance(r, BaseException)]
        # The batch's values are checked here, on the devices, rather than by a pass over
        # it on the host: a NaN or an infinity in x or y makes the loss or the summed
        # gradient (a NaN input reaches the first layer's weight gradient even where an
        # activation drops it) non-finite, and then nothing is applied. The replicas hold
        # the same stats: any one's loss and norm are the step's.
        loss, norm = (float(done[0][0]) / total, math.sqrt(float(done[0][1]))) if done \
            else (math.nan, math.nan)
        if stepped:
            self._done_step = (loss, norm)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        if len(stepped) < len(slots):
            raise InvalidArgument(
                f"the step's loss ({loss}) or gradient norm ({norm}) is not finite: a NaN or "
                "an infinity in the batch, or a diverged model; nothing was applied")
        return loss, norm

    @staticmethod
    async def _finish(index: int, calls: list[Thunk], stepped: set[int]) -> Array:
        """Run a replica's ``calls`` (its step's last one answers its stats); count the
        replica in ``stepped`` when its flag says the update was applied."""
        stats: Array = (await gather(calls))[-1]
        if stats[2] != 0:
            stepped.add(index)
        return stats

    async def _reduce(self, ready: list[list[asyncio.Future[None]]]) -> None:
        """All-reduce (sum) the buckets in backward's order, each launched as soon as
        every replica has submitted the ops that complete it (module doc), without
        waiting for the earlier buckets' to finish: each rank's device runs them in
        launch order, each behind the ops that write its bucket, so no host round trip
        comes between two of them. The last bucket's launch (one group) sums the step
        stats too. Answers once every one has finished (the first error, the others
        cancelled).

        Measured on 2 x H200 (an MLP of 4 x 4096): one group of every bucket after the
        whole backward made a step slower than this (35 ms against 24 ms, against 17
        and 14 ms on one GPU in the same runs)."""
        world = self.world
        assert world is not None
        slots = self.slots
        timeout = self.spec.collective_timeout
        stats = [s.replica.step_stats for s in slots]
        count = len(ready[0])
        launched: list[asyncio.Future[None]] = []
        try:
            for index in range(count):
                await asyncio.gather(*(marks[index] for marks in ready))
                buckets = [s.replica.gradient_buckets[index] for s in slots]
                launched.append(start_now(
                    world.all_reduce_async(buckets, timeout_secs=timeout) if index < count - 1
                    else _summed_with(world, buckets, stats, timeout)))
            if not count:
                launched.append(start_now(world.all_reduce_async(stats, timeout_secs=timeout)))
        except BaseException:
            await _cancel_all(launched)
            raise
        await _all_or_first_error(launched)

    # ------------------------------------------------------------------ recovery

    async def _heal_between_steps(self) -> int:
        """Rebuild replicas whose context went down since the last step."""
        unsettled, self._unsettled = self._unsettled, False
        if not unsettled and all(s.device.generation == s.generation for s in self.slots):
            return 0
        rebuilt, _ = await self._recover(ContextPoisoned("a replica's context was rebuilt "
                                                         "between two steps"), set())
        return rebuilt

    async def _recover(self, reason: GpuRuntimeError, stepped: set[int]) -> tuple[int, bool]:
        """Bring every replica back to one state (module doc). Answers how many replicas
        were rebuilt and whether the failed step's update stands (then not run again)."""
        started = time.perf_counter()
        slots = self.slots
        generations = await asyncio.gather(*(settled_generation(s.device, REBUILD_TIMEOUT)
                                             for s in slots))
        broken = {i for i, (s, g) in enumerate(zip(slots, generations, strict=True))
                  if g != s.generation}
        healthy = [i for i in range(len(slots)) if i not in broken]
        if not healthy:
            await self._rewind(repr(reason), broken, started)
            return len(broken), False
        source = next((i for i in healthy if i in stepped), healthy[0])
        done = source in stepped
        state = await slots[source].replica.state_dict_async()
        targets = [i for i in range(len(slots))
                   if i != source and (i in broken or (i in stepped) != done)]
        for index in targets:
            await self._restore(index, state, index in broken)
        self._publish(broken, reason, f"replica {source}", started)
        return len(broken), done

    async def _restore(self, index: int, state: dict[str, Array], rebuild: bool) -> None:
        slot = self.slots[index]
        if rebuild:
            slot = self.slots[index] = await self._build(slot.device)
        await slot.replica.load_state_dict_async(state)

    async def _rewind(self, reason: str, broken: set[int] | None = None,
                      started: float | None = None) -> None:
        """No healthy replica is left: rebuild all from the last checkpoint, then replay
        the batches trained since."""
        begin = time.perf_counter() if started is None else started
        ledger = self.ledger
        checkpoint = ledger.checkpoint
        if checkpoint is None:
            raise Unrecoverable(
                f"no healthy replica is left ({reason}) and the trainer keeps no checkpoint "
                "(checkpoint_every=0): its state is lost")
        gone = set(range(len(self.slots))) if broken is None else broken
        for index in range(len(self.slots)):
            await self._restore(index, checkpoint.state, index in gone and broken is not None)
        replay = list(ledger.since)
        for xs, ys in replay:
            await self._attempt(xs, ys, set())
        ledger.replayed_steps += len(replay)
        self._publish(gone, ContextPoisoned(reason), f"checkpoint@{checkpoint.steps}", begin)

    def _publish(self, broken: set[int], reason: GpuRuntimeError, source: str,
                 started: float) -> None:
        seconds = time.perf_counter() - started
        ledger = self.ledger
        ledger.recoveries += len(broken)
        ledger.last_recovery_seconds = seconds
        path = self.context.self_ref.path
        for index in sorted(broken):
            self.context.system.event_stream.publish(ReplicaRecovered(
                path, index, self.slots[index].device.ref.path,
                f"{type(reason).__name__}: {reason}", source, ledger.steps, seconds))

    async def _guarded(self, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, rebuilding broken replicas and calling once more if a context died."""
        await self._heal_between_steps()
        try:
            return await call()
        except RECOVERABLE as exc:
            await self._recover(exc, set())
            return await call()

    # ------------------------------------------------------------------ the rest

    async def _first_state(self) -> dict[str, Array]:
        return await self.slots[0].replica.state_dict_async()

    async def _predict(self, rows: Array) -> Array:
        await self._require_model()
        require_width(rows, self.features)
        return await self._guarded(lambda: self._predict_rows(rows))

    async def _predict_rows(self, rows: Array) -> Array:
        shares = [s for s in plan_shares(len(rows), len(self.slots), None) if s.rows]
        parts = await asyncio.gather(*(slot.replica.predict_async(rows[s.start:s.stop])
                                       for slot, s in zip(self.slots, shares, strict=False)))
        return np.concatenate([np.asarray(p) for p in parts])

    async def _evaluate(self, xs: Array, ys: Array) -> dict[str, float]:
        await self._require_model()
        require_width(xs, self.features)
        outputs = await self._guarded(lambda: self._predict_rows(xs))
        return self.spec.metrics(outputs, ys)

    async def _load(self, state: dict[str, Array]) -> None:
        await self._require_model()
        await self._heal_between_steps()
        await asyncio.gather(*(s.replica.load_state_dict_async(state) for s in self.slots))
        self.ledger.keep(dict(state))

    def _stats(self) -> TrainerStats:
        ledger = self.ledger
        buckets = len(self.slots[0].replica.gradient_buckets) if self.slots else 0
        checkpoint = ledger.checkpoint
        return TrainerStats(
            ledger.steps, ledger.samples, self.spec.n_replicas,
            tuple(d.ref.path for d in self.devices), ledger.recoveries, ledger.redone_steps,
            ledger.replayed_steps, ledger.last_recovery_seconds,
            0 if checkpoint is None else checkpoint.steps, ledger.last_loss,
            None if self.world is None else self.world.epoch, buckets)


async def _summed_with(world: Collective, buckets: list[GpuBuffer], stats: list[GpuBuffer],
                       timeout: float) -> None:
    """All-reduce ``buckets`` and ``stats`` in one launch (a group)."""
    async with world.group(timeout_secs=timeout):
        await world.all_reduce_async(buckets)
        await world.all_reduce_async(stats)


def _mark(ready: list[asyncio.Future[None]], index: int) -> None:
    """Bucket ``index`` of a replica is complete for every op submitted so far."""
    if not ready[index].done():
        ready[index].set_result(None)


async def _cancel_all(tasks: list[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _all_or_first_error(tasks: list[asyncio.Future[T]]) -> list[T]:
    """Every task's result; at the first error cancel the others (and wait for them)."""
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        await _cancel_all(list(pending))
        for task in tasks:  # the first error, not the cancellations it caused
            if task in done and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
    except BaseException:
        await _cancel_all(list(tasks))
        raise
