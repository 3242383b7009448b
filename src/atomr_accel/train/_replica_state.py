"""The buffers of a ``ModelReplica`` and its state: where each parameter lives, and the
reads and writes of parameters, gradients, optimizer state and step count."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import numpy as np

from atomr_accel.backends._state import Lru
from atomr_accel.blueprint import twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.core._files import read_npz
from atomr_accel.core._op import Op, validated
from atomr_accel.core.ops._graph import OpSequence, may_sequence
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._device import Device
from atomr_accel.train._layers import ParamSlot
from atomr_accel.train._model import Array, Sequential
from atomr_accel.train._optim import Loss, Optimizer

__all__ = ["STEP_KEY", "OpCall", "ParamInfo", "ReplicaState", "Thunk", "bucket_layout",
           "checked_parameters", "gather", "require_real", "start_now"]

STEP_KEY = "optimizer.step"
"""The key of the optimizer's step count in a replica's state dict."""


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """Where one named parameter lives: its bucket, offset and shape there."""

    bucket: int
    offset: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Its element count."""
        return math.prod(self.shape)


def bucket_layout(model: Sequential,
                  ) -> tuple[dict[str, ParamInfo], list[ParamSlot | None], list[int]]:
    """Where ``model``'s parameters live: each one's ``ParamInfo`` by torch-style name,
    each layer's ``ParamSlot`` (None without parameters) and each bucket's size (one
    bucket a parametrized layer: its weight, then its bias)."""
    layout: dict[str, ParamInfo] = {}
    slots: list[ParamSlot | None] = []
    sizes: list[int] = []
    for index, layer in zip(model.indices, model.layers, strict=True):
        local = layer.parameter_shapes()
        if not local:
            slots.append(None)
            continue
        bucket, offset, offsets = len(sizes), 0, {}
        for name, shape in local.items():
            layout[f"{index}.{name}"] = ParamInfo(bucket, offset, shape)
            offsets[name] = offset
            offset += math.prod(shape)
        slots.append(ParamSlot(bucket, offsets["weight"], offsets.get("bias")))
        sizes.append(offset)
    return layout, slots, sizes

Thunk = Callable[[], Coroutine[Any, Any, Any]]
"""A call that makes one device call's coroutine (made only when it is started)."""

T = TypeVar("T")


def start_now(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task of ``coro`` on the running loop, run up to its first wait at once where
    Python can (3.12's eager start): a device call's op is then on its way when this
    returns, instead of a loop turn later."""
    loop = asyncio.get_running_loop()
    if _EAGER:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    return loop.create_task(coro)

_EAGER = sys.version_info >= (3, 12)


@dataclass(frozen=True, slots=True)
class OpCall:
    """A ``Thunk`` that runs one op on ``device``: ``gather`` sends a run of these on one
    device as one ``OpSequence``."""

    device: Device
    op: Op
    timeout: float | None
    checked: bool = False
    """``op`` is what ``validated`` returned (the device need not check it again)."""

    def __call__(self) -> Coroutine[Any, Any, Any]:
        return self.device.run_async(self.op, self.timeout, checked=self.checked)

_CHECKED: Lru[OpSequence] = Lru(512)
"""Sequences validated before, by their ops: a trainer sends the same few every step.
Ops compare by value (``1 == 1.0 == True``), so this suits ops made by the replicas from
values they have checked already, not a caller's ops as given."""


def _sequence_call(run: list[OpCall]) -> OpCall:
    """One call of the ``OpSequence`` of ``run``'s ops, validated once for all the times
    the same ops come again (a malformed one goes unchecked: the device refuses it as it
    would have refused the op alone)."""
    first = run[0]
    ops = tuple(c.op for c in run)
    try:
        sequence = _CHECKED.get(ops, lambda: validated(OpSequence(ops)))
    except (TypeError, InvalidArgument):  # an op with an unhashable field, or a malformed
        return OpCall(first.device, OpSequence(ops), first.timeout)  # one: the device checks
    return OpCall(first.device, sequence, first.timeout, checked=True)


def _sequenced(thunks: Sequence[Thunk]) -> tuple[list[Thunk], list[int]]:
    """``thunks`` with each run of two or more ``OpCall``s of one device (and time-out) made
    one call of their ``OpSequence`` (where the device has the graph library, which runs
    sequences); and how many results each call stands for (0: one that is not a
    sequence)."""
    calls: list[Thunk] = []
    spans: list[int] = []
    run: list[OpCall] = []

    def close() -> None:
        if len(run) > 1:
            calls.append(_sequence_call(run))
            spans.append(len(run))
        else:
            calls.extend(run)
            spans.extend([0] * len(run))
        run.clear()

    for thunk in thunks:
        if isinstance(thunk, OpCall) and may_sequence(thunk.op) \
                and OpSequence.library in thunk.device.config.libraries:
            if run and (run[0].device is not thunk.device or run[0].timeout != thunk.timeout):
                close()
            run.append(thunk)
            continue
        close()
        calls.append(thunk)
        spans.append(0)
    close()
    return calls, spans


async def gather(thunks: Sequence[Thunk]) -> list[Any]:
    """Start every call in order (each reaches the device in that order, at once where
    ``start_now`` can) and await them once; the first error is raised after all have
    finished. Consecutive ``OpCall``s of one device go as one ``OpSequence`` (one request
    instead of one each); the results keep their places."""
    calls, spans = _sequenced(thunks)
    tasks = [start_now(make()) for make in calls]
    answers = await asyncio.gather(*tasks, return_exceptions=True)
    results: list[Any] = []
    for answer, span in zip(answers, spans, strict=True):
        if isinstance(answer, BaseException):
            raise answer
        if span:
            results.extend(answer)
        else:
            results.append(answer)
    return results


class ReplicaState:
    """A model's buffers on one device: parameters, gradients and optimizer state in
    buckets (one per parametrized layer), and the reads and writes of that state."""

    def __init__(self, device: Device, model: Sequential, loss: Loss, optimizer: Optimizer,
                 dtype: DType, layout: dict[str, ParamInfo], slots: list[ParamSlot | None],
                 params: list[GpuBuffer], grads: list[GpuBuffer],
                 state: dict[str, list[GpuBuffer]], seed: int,
                 timeout_secs: float | None) -> None:
        """Use ``create_async``; this only binds what it made."""
        self.device = device
        self.model = model
        self.loss = loss
        self.optimizer = optimizer
        self.dtype = dtype
        self.parameter_layout = layout
        """Each parameter's ``ParamInfo`` by name, in declaration order."""
        self.slots = slots
        """Each layer's ``ParamSlot`` (None for a layer without parameters)."""
        self.params = params
        """The parameter buckets, in declaration order (one per parametrized layer)."""
        self.grads = grads
        """The gradient buckets, in declaration order (``gradient_buckets`` is reversed)."""
        self.optimizer_state = state
        """Each optimizer state's buckets by name (``"exp_avg"``, ...), declaration order."""
        self.step = 0
        """Optimizer updates applied so far."""
        self.seed = seed
        self._timeout = timeout_secs
        self._portal = device._portal
        self._work: dict[tuple[Any, ...], GpuBuffer] = {}

    # -------------------------------------------------------------- layout

    @property
    def gradient_buckets(self) -> list[GpuBuffer]:
        """The gradient buffers in the order backward fills them: the last layer's first."""
        return self.grads[::-1]

    def bucket_names(self, position: int) -> list[str]:
        """The parameters in ``gradient_buckets[position]``."""
        bucket = len(self.grads) - 1 - position
        return [name for name, info in self.parameter_layout.items() if info.bucket == bucket]

    # ----------------------------------------------------------- plumbing

    def _run(self, op: Op) -> Thunk:
        return OpCall(self.device, op, self._timeout)

    async def _buffer(self, key: tuple[Any, ...], length: int,
                      dtype: DType | None = None) -> GpuBuffer:
        """A work buffer of at least ``length`` elements kept under ``key`` (made again,
        larger, when a batch outgrows it)."""
        buf = self._work.get(key)
        kind = dtype or self.dtype
        if buf is None or len(buf) < length or buf.dtype != kind:
            buf = await self.device.allocate_async(max(length, 1), kind,
                                                   timeout_secs=self._timeout)
            self._work[key] = buf
        return buf

    def _upload(self, buf: GpuBuffer, data: Array) -> Thunk:
        """The upload of ``data`` (flattened, cast to the buffer's dtype) to the start of
        ``buf``."""
        flat = np.ascontiguousarray(data, dtype=buf.dtype.numpy).reshape(-1)
        return partial(self.device.copy_from_numpy_async, buf, flat, 0,
                       timeout_secs=self._timeout)

    async def _upload_buckets(self, buckets: list[GpuBuffer], values: Mapping[str, Array],
                              suffix: str = "") -> None:
        host = [np.zeros(len(b), self.dtype.numpy) for b in buckets]
        for name, info in self.parameter_layout.items():
            host[info.bucket][info.offset: info.offset + info.size] = \
                values[name + suffix].reshape(-1)
        await gather([partial(self.device.copy_from_numpy_async, b, h,
                               timeout_secs=self._timeout)
                       for b, h in zip(buckets, host, strict=True)])

    async def _download_buckets(self, buckets: list[GpuBuffer], suffix: str = "",
                                ) -> dict[str, Array]:
        host = await gather([partial(self.device.copy_to_numpy_async, b,
                                      timeout_secs=self._timeout) for b in buckets])
        return {name + suffix: host[info.bucket][info.offset: info.offset + info.size]
                .reshape(info.shape).copy() for name, info in self.parameter_layout.items()}

    # ------------------------------------------------------------- state

    async def parameters_async(self) -> dict[str, Array]:
        """The parameters by name, as host arrays."""
        return await self._download_buckets(self.params)

    parameters = twin(parameters_async, on_loop=True)

    async def gradients_async(self) -> dict[str, Array]:
        """The accumulated gradients by parameter name, as host arrays."""
        return await self._download_buckets(self.grads)

    gradients = twin(gradients_async, on_loop=True)

    async def state_dict_async(self) -> dict[str, Array]:
        """Parameters (by name), optimizer state (``"optimizer.<name>.<state>"``) and the
        step count (``"optimizer.step"``), as host arrays."""
        out = await self._download_buckets(self.params)
        for state, buckets in self.optimizer_state.items():
            values = await self._download_buckets(buckets)
            out.update({f"optimizer.{k}.{state}": v for k, v in values.items()})
        out[STEP_KEY] = np.array(self.step, np.int64)
        return out

    state_dict = twin(state_dict_async, on_loop=True)

    async def load_state_dict_async(self, state: Mapping[str, Any]) -> None:
        """Load what ``state_dict_async`` answered: exactly its keys (the same model and
        optimizer kind), shapes checked, before anything is written."""
        if not isinstance(state, Mapping):
            raise InvalidArgument(f"state must be a mapping, got {type(state).__name__}")
        shapes = {name: info.shape for name, info in self.parameter_layout.items()}
        known = {*shapes, STEP_KEY, *(f"optimizer.{k}.{name}" for k in shapes
                                       for name in self.optimizer_state)}
        extra = sorted(str(k) for k in state if k not in known)
        if extra:
            raise InvalidArgument(f"state has keys this replica does not keep: {extra[:4]}")
        params = checked_parameters({k: state[k] for k in shapes if k in state}, shapes,
                                     self.dtype)
        if STEP_KEY not in state:
            raise InvalidArgument(f"state has no {STEP_KEY!r}")
        step = np.asarray(state[STEP_KEY])
        if step.shape != () or step.dtype.kind not in "iu" or int(step) < 0:
            raise InvalidArgument(f"{STEP_KEY} must be an int >= 0, got {step!r}")
        loads: list[tuple[list[GpuBuffer], dict[str, Array]]] = [(self.params, params)]
        for name, buckets in self.optimizer_state.items():
            keyed = {k: state.get(f"optimizer.{k}.{name}") for k in shapes}
            missing = [k for k, v in keyed.items() if v is None]
            if missing:
                raise InvalidArgument(f"state has no optimizer.{missing[0]}.{name}")
            loads.append((buckets, checked_parameters(keyed, shapes, self.dtype)))
        for buckets, values in loads:
            await self._upload_buckets(buckets, values)
        self.step = int(step)

    load_state_dict = twin(load_state_dict_async, on_loop=True)

    async def save_async(self, path: str | os.PathLike[str]) -> None:
        """Write ``state_dict`` to an ``.npz`` file at ``path``."""
        state = await self.state_dict_async()
        np.savez(path, **state)  # type: ignore[arg-type]

    save = twin(save_async, on_loop=True)

    async def load_async(self, path: str | os.PathLike[str]) -> None:
        """Load a state written by ``save`` from ``path``."""
        await self.load_state_dict_async(read_npz(path, "a saved state"))

    load = twin(load_async, on_loop=True)


def require_real(name: str, value: object) -> None:
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value)):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")


def checked_parameters(values: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]],
                        dtype: DType) -> dict[str, Array]:
    """``values`` as contiguous arrays of ``dtype`` with exactly the names and shapes of
    ``shapes`` (``InvalidArgument`` otherwise; torch tensors are taken through NumPy)."""
    if not isinstance(values, Mapping):
        raise InvalidArgument(f"parameters must be a mapping of name to array, got "
                              f"{type(values).__name__}")
    missing = [k for k in shapes if k not in values]
    extra = [k for k in values if k not in shapes]
    if missing or extra:
        raise InvalidArgument(f"parameters do not match the model: missing {missing}, "
                              f"unknown {extra}")
    out: dict[str, Array] = {}
    for name, shape in shapes.items():
        value = values[name]
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        array = np.asarray(value)
        if array.dtype.kind not in "fiu":
            raise DTypeMismatch(f"parameter {name} holds {array.dtype}, not numbers")
        if array.shape != shape:
            raise InvalidArgument(f"parameter {name} has shape {array.shape}, expected {shape}")
        out[name] = np.ascontiguousarray(array, dtype=dtype.numpy)
    return out
