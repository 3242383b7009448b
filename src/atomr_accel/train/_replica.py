"""ModelReplica: a model instantiated on one device, the unit every trainer uses.

**Buffers.** Parameters live in **one buffer per parametrized layer** (a
``Linear`` or ``LayerNorm``: its weight, then its bias), called a *bucket*;
the gradients live in buffers of the same layout (``gradient_buckets``), and
so does each optimizer state (Adam's ``exp_avg`` / ``exp_avg_sq``, SGD's
``momentum_buffer``). ``parameter_layout`` says where each named parameter
is. A trainer all-reduces gradients one bucket at a time: ``gradient_buckets``
lists them in the order backward fills them, **last layer first**, and
``backward_async(bucket_ready=fn)`` calls ``fn(i)`` as soon as the op that
completes ``gradient_buckets[i]`` has been submitted. Ops of one device run
in the order they are submitted, and the device orders every op after the
earlier ops that wrote its buffers (``backends.cuda._backend``: events per
buffer across streams), so a collective submitted from ``fn`` sees the whole
gradient while backward goes on for the layers before it.

**Order and awaiting.** Each method submits its ops back to back, in order, and
awaits them together once; each run of ops between two uploads (or two buckets
handed on) goes as one ``OpSequence`` request (``_replica_state.gather``).
``train_step_async`` does the whole step (zero, forward, loss, backward, update,
the loss's download) in one such batch.

**Micro-batches.** ``forward_async(x, micro_batch=k)`` keeps what backward
needs under the tag ``k`` (its own activation buffers), so several
micro-batches may be in flight (1F1B); ``loss_async`` / ``backward_async`` with
the same tag use them, and gradients accumulate until ``zero_grad_async``.

Parameters and activations are f32, or f64 (float64 checks); bf16/f16 are not
supported. Every bad argument raises ``InvalidArgument`` (``DTypeMismatch`` for
an array of the wrong kind) before any op is submitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ParamSpec, TypeVar

import numpy as np

from atomr_accel.blueprint import twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.core._op import is_int
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blas_vectors import Axpy
from atomr_accel.core.ops._train import (
    STATS_LENGTH,
    FillZeros,
    MseLoss,
    SoftmaxCrossEntropy,
)
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._device import Device
from atomr_accel.train._dp_replica import MicroBatch
from atomr_accel.train._layers import (
    Saved,
    aliases,
    backward_ops,
    forward_ops,
    saved_sizes,
)
from atomr_accel.train._model import Array, Dropout, Flatten, Sequential, train_dtype
from atomr_accel.train._optim import (
    CrossEntropyLoss,
    Loss,
    MSELoss,
    Optimizer,
    require_loss,
    require_optimizer,
)
from atomr_accel.train._replica_state import (
    ParamInfo,
    Thunk,
    bucket_layout,
    checked_parameters,
    gather,
    require_real,
)
from atomr_accel.train._replica_update import ReplicaUpdates

__all__ = ["ModelReplica", "ParamInfo"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class _Tape:
    """One micro-batch's forward: shapes, input buffers of each layer and saved values."""

    rows: int
    train: bool
    shapes: list[tuple[int, ...]]
    inputs: list[GpuRef]
    output: GpuBuffer
    saved: list[Saved]
    keep: list[GpuBuffer] = field(default_factory=list)
    loss_grad: GpuBuffer | None = None


def _features(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(rows, features)`` of a host shape: the last axis against the others."""
    return math.prod(shape[:-1]), shape[-1]


def _flattened(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], math.prod(shape[1:])) if len(shape) > 1 else shape


class ModelReplica(ReplicaUpdates):
    """A ``Sequential`` on one device with its loss, optimizer, gradients and state.

    Make one with ``await ModelReplica.create_async(device, model, loss=...,
    optimizer=...)`` (or ``create``). Every ``*_async`` method has a blocking
    twin without the suffix (never call those on the system's event loop).
    See the module docstring for the buffers' layout and how ops are ordered;
    ``ReplicaState`` holds the buffers and the state's reads and writes,
    ``ReplicaUpdates`` the optimizer and the second half of a trainer's step.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Use ``create_async``; this only binds what it made (``ReplicaState``'s
        arguments)."""
        super().__init__(*args, **kwargs)
        self._tapes: dict[int, _Tape] = {}
        self._loss_buffer: GpuBuffer | None = None

    # ------------------------------------------------------------ creation

    @classmethod
    async def create_async(cls, device: Device, model: Sequential, *, loss: Loss,
                           optimizer: Optimizer, parameters: Mapping[str, Any] | None = None,
                           seed: int = 0, dtype: DType | str = "f32",
                           timeout_secs: float | None = 30.0) -> ModelReplica:
        """Instantiate ``model`` on ``device``: parameters (``parameters`` by torch-style
        name, or ``model.init_parameters(seed, dtype)``), zeroed gradients and optimizer
        state in device buffers. ``seed`` also seeds Dropout masks; ``timeout_secs``
        bounds each device request, a run of ops sent as one ``OpSequence`` counting as one
        (None: the system's ``op_timeout``)."""
        if not isinstance(device, Device):
            raise InvalidArgument(f"device must be a Device, got {type(device).__name__}")
        if not isinstance(model, Sequential):
            raise InvalidArgument(f"model must be a Sequential, got {type(model).__name__}")
        require_loss(loss)
        require_optimizer(optimizer)
        if not is_int(seed) or seed < 0:
            raise InvalidArgument(f"seed must be an int >= 0, got {seed!r}")
        if timeout_secs is not None:
            require_real("timeout_secs", timeout_secs)
            if timeout_secs <= 0:
                raise InvalidArgument(f"timeout_secs must be > 0 or None, got {timeout_secs!r}")
        kind = train_dtype(dtype)
        shapes = model.parameter_shapes()
        values = (model.init_parameters(seed, kind) if parameters is None
                  else checked_parameters(parameters, shapes, kind))
        layout, slots, sizes = bucket_layout(model)
        params = [await device.allocate_async(n, kind, timeout_secs=timeout_secs)
                  for n in sizes]
        grads = [await device.allocate_async(n, kind, timeout_secs=timeout_secs)
                 for n in sizes]
        state = {name: [await device.allocate_async(n, kind, timeout_secs=timeout_secs)
                        for n in sizes] for name in optimizer.state_names}
        replica = cls(device, model, loss, optimizer, kind, layout, slots, params, grads,
                      state, int(seed), timeout_secs)
        await replica._upload_buckets(replica.params, values)
        return replica

    @classmethod
    def create(cls, device: Device, model: Sequential, *, loss: Loss, optimizer: Optimizer,
               parameters: Mapping[str, Any] | None = None, seed: int = 0,
               dtype: DType | str = "f32", timeout_secs: float | None = 30.0) -> ModelReplica:
        """Blocking twin of ``create_async`` (never call it on the system's event loop)."""
        if not isinstance(device, Device):
            raise InvalidArgument(f"device must be a Device, got {type(device).__name__}")
        return device._portal.call(cls.create_async(
            device, model, loss=loss, optimizer=optimizer, parameters=parameters, seed=seed,
            dtype=dtype, timeout_secs=timeout_secs))

    def _host_input(self, x: Any) -> Array:
        data = np.asarray(x)
        if data.dtype.kind not in "fiu" or data.dtype == np.bool_:
            raise DTypeMismatch(f"x must hold numbers, got dtype {data.dtype}")
        if data.ndim < 2 or data.size == 0:
            raise InvalidArgument(f"x must be a non-empty batch of shape (batch, features...), "
                                  f"got shape {data.shape}")
        return np.ascontiguousarray(data, dtype=self.dtype.numpy)

    # ------------------------------------------------------------ forward

    async def _forward_ops(self, x: Any, micro_batch: int, train: bool,
                           shape: tuple[int, ...] | None, draw: int = 0,
                           ) -> tuple[list[Thunk], _Tape]:
        """Make (allocating what is missing) the coroutines of a forward; keep its tape.
        Dropout's masks are drawn from the replica's seed, the step, the layer,
        ``micro_batch`` and ``draw`` (which tells apart the forwards of one step that share
        a ``micro_batch`` key: a trainer's micro-batches)."""
        if not is_int(micro_batch) or micro_batch < 0:
            raise InvalidArgument(f"micro_batch must be an int >= 0, got {micro_batch!r}")
        if not isinstance(train, bool):
            raise InvalidArgument(f"train must be a bool, got {train!r}")
        coros: list[Thunk] = []
        keep: list[GpuBuffer] = []
        if isinstance(x, GpuBuffer):
            ref = self.device.ref_of(x, "x")
            if ref.dtype is not self.dtype:
                raise DTypeMismatch(f"x holds {ref.dtype.value}; the replica's dtype is "
                                    f"{self.dtype.value}")
            if shape is None:
                first = self.model.in_features()
                if first is None or len(x) % first:
                    raise InvalidArgument("pass shape= for a GpuBuffer input: the model's "
                                          "first layer does not fix its features")
                shape = (len(x) // first, first)
            if math.prod(shape) > len(x):
                raise InvalidArgument(f"x holds {len(x)} elements, fewer than shape {shape}")
            current, keep = ref, [x]
        else:
            data = self._host_input(x)
            shape = data.shape
            buf = await self._buffer(("x", micro_batch), data.size)
            coros.append(self._upload(buf, data))
            current = buf.ref
        shape = tuple(int(s) for s in shape)
        rows = shape[0]
        shapes, inputs, saved = [shape], [], []
        seeds, drawn, uploads = await self._seeds(micro_batch, train), [], len(coros)
        for i, (index, layer) in enumerate(zip(self.model.indices, self.model.layers,
                                               strict=True)):
            if isinstance(layer, Flatten):
                out_shape = _flattened(shape)
            else:
                lead, features = _features(shape)
                out_shape = (*shape[:-1], layer.features_out(features))
            lead, features = _features(shape)
            inputs.append(current)
            tags: dict[str, GpuRef] = {}
            for name, n in saved_sizes(layer, lead, features, train).items():
                kind = DType.U8 if name == "mask" else self.dtype
                tags[name] = (await self._buffer((name, micro_batch, i), n, kind)).ref
            saved.append(Saved(**tags))
            if not aliases(layer, train):
                y = await self._buffer(("act", micro_batch, i), math.prod(out_shape))
                slot = self.slots[i]
                params = self.params[slot.bucket].ref if slot is not None else None
                if isinstance(layer, Dropout):
                    drawn.append(hash((self.seed, self.step, index, micro_batch, draw))
                                 & (2**63 - 1))
                coros += [self._run(op) for op in forward_ops(
                    layer, current, y.ref, lead, features, params, slot, saved[-1], train,
                    len(drawn) - 1, None if seeds is None else seeds.ref)]
                current = y.ref
            shape = out_shape
            shapes.append(shape)
        if seeds is not None:  # before the forward's ops, beside the batch's upload
            coros.insert(uploads, self._upload(seeds, np.array(drawn, dtype=np.uint64)))
        out = self._device_buffer(current, keep)
        tape = _Tape(rows, train, shapes, inputs, out, saved, keep)
        self._tapes[micro_batch] = tape
        return coros, tape

    async def _seeds(self, micro_batch: int, train: bool) -> GpuBuffer | None:
        """The u64 buffer a forward's Dropout ops read their masks' seeds from, one element
        a Dropout layer that drops (None where none does). The step's seeds are uploaded
        there, so the forward's ops are the same every step (and replayed as a graph)."""
        count = sum(isinstance(layer, Dropout) and not aliases(layer, train)
                    for layer in self.model.layers)
        return await self._buffer(("seeds", micro_batch), count, DType.U64) if count else None

    def _device_buffer(self, ref: GpuRef, keep: list[GpuBuffer]) -> GpuBuffer:
        """The ``GpuBuffer`` behind ``ref`` among the replica's work buffers and ``keep``."""
        for buf in (*keep, *self._work.values()):
            if buf.ref == ref:
                return buf
        raise AssertionError("the output is always a work buffer or the input")

    async def forward_async(self, x: Any, *, train: bool = True, micro_batch: int = 0,
                            shape: tuple[int, ...] | None = None) -> GpuBuffer:
        """Run the model on ``x`` (a NumPy batch, or a ``GpuBuffer`` of this device with
        ``shape`` unless the first layer fixes the features) and answer the output buffer:
        its first ``prod(output_shape(micro_batch))`` elements, row-major (work buffers
        are kept for the largest batch seen), valid until the next forward of this
        ``micro_batch``. ``train=False``: Dropout is
        the identity and nothing is kept for backward."""
        coros, tape = await self._forward_ops(x, micro_batch, train, shape)
        await gather(coros)
        return tape.output

    forward = twin(forward_async, on_loop=True)

    def output_shape(self, micro_batch: int = 0) -> tuple[int, ...]:
        """The shape of the last forward's output of ``micro_batch``."""
        return self._tape(micro_batch).shapes[-1]

    def _tape(self, micro_batch: int) -> _Tape:
        tape = self._tapes.get(micro_batch)
        if tape is None:
            raise InvalidArgument(f"no forward of micro_batch {micro_batch!r} to use; run "
                                  "forward_async first")
        return tape

    # --------------------------------------------------------------- loss

    async def _loss_ops(self, y: Any, micro_batch: int, grad_scale: float
                        ) -> list[Thunk]:
        tape = self._tape(micro_batch)
        out_shape = tape.shapes[-1]
        loss = self._loss_buffer = await self._buffer(("loss",), 1)
        target = np.asarray(y)
        if isinstance(self.loss, CrossEntropyLoss):
            if len(out_shape) != 2:
                raise InvalidArgument(f"CrossEntropyLoss takes (batch, classes) outputs, got "
                                      f"{out_shape}")
            rows, classes = out_shape
            if target.dtype.kind not in "iu":
                raise DTypeMismatch(f"CrossEntropyLoss takes integer labels, got {target.dtype}")
            if target.shape != (rows,):
                raise InvalidArgument(f"labels must have shape ({rows},), got {target.shape}")
            if target.size and (target.min() < 0 or target.max() >= classes):
                raise InvalidArgument(f"labels must lie in [0, {classes})")
            labels = await self._buffer(("labels", micro_batch), rows, DType.I32)
            grad = await self._buffer(("loss_grad", micro_batch), rows * classes)
            tape.loss_grad = grad
            return [self._upload(labels, target.astype(np.int32)),
                    self._run(SoftmaxCrossEntropy(
                        tape.output.ref, labels.ref, loss.ref, grad.ref, rows, classes,
                        self.loss.label_smoothing, grad_scale))]
        assert isinstance(self.loss, MSELoss)
        if target.dtype.kind not in "fiu":
            raise DTypeMismatch(f"MSELoss takes numeric targets, got {target.dtype}")
        if target.shape != out_shape:
            raise InvalidArgument(f"targets must have the output's shape {out_shape}, got "
                                  f"{target.shape}")
        count = math.prod(out_shape)
        buf = await self._buffer(("target", micro_batch), count)
        grad = await self._buffer(("loss_grad", micro_batch), count)
        tape.loss_grad = grad
        return [self._upload(buf, target),
                self._run(MseLoss(tape.output.ref, buf.ref, loss.ref, grad.ref, count,
                                  grad_scale))]

    async def _read_loss(self) -> float:
        assert self._loss_buffer is not None
        value = await self.device.copy_to_numpy_async(self._loss_buffer, 0, 1,
                                                      timeout_secs=self._timeout)
        return float(value[0])

    async def loss_async(self, y: Any, *, micro_batch: int = 0,
                         grad_scale: float = 1.0) -> float:
        """The loss of the last forward of ``micro_batch`` against ``y`` (integer labels
        for ``CrossEntropyLoss``, targets shaped like the output for ``MSELoss``); its
        gradient (times ``grad_scale``) is left ready for ``backward_async``."""
        require_real("grad_scale", grad_scale)
        await gather(await self._loss_ops(y, micro_batch, float(grad_scale)))
        return await self._read_loss()

    compute_loss = twin(loss_async, on_loop=True)
    compute_loss.__name__ = compute_loss.__qualname__ = "compute_loss"

    # ----------------------------------------------------------- backward

    async def _backward_ops(self, grad_out: Any, micro_batch: int, want_input_grad: bool,
                            bucket_ready: Callable[[int], None] | None,
                            ) -> tuple[list[Thunk], GpuRef | None]:
        tape = self._tape(micro_batch)
        if not tape.train:
            raise InvalidArgument("backward needs a forward run with train=True")
        coros: list[Thunk] = []
        count = math.prod(tape.shapes[-1])
        if grad_out is None:
            if tape.loss_grad is None:
                raise InvalidArgument("no loss to differentiate: run loss_async first or pass "
                                      "grad_out")
            dy: GpuRef = tape.loss_grad.ref
        elif isinstance(grad_out, GpuBuffer):
            dy = self.device.ref_of(grad_out, "grad_out")
            if dy.dtype is not self.dtype or dy.length < count:
                raise InvalidArgument(f"grad_out must hold {count} {self.dtype.value} values")
            tape.keep.append(grad_out)
        else:
            data = np.asarray(grad_out)
            if data.shape != tape.shapes[-1]:
                raise InvalidArgument(f"grad_out must have the output's shape "
                                      f"{tape.shapes[-1]}, got {data.shape}")
            buf = await self._buffer(("grad_out", micro_batch), count)
            coros.append(self._upload(buf, data))
            dy = buf.ref
        last = len(self.grads) - 1
        layers = list(enumerate(self.model.layers))
        for i, layer in reversed(layers):
            rows, features = _features(tape.shapes[i])
            if aliases(layer, True):
                continue  # Flatten, or a Dropout that dropped nothing: the gradient passes
            need_dx = want_input_grad or any(s is not None for s in self.slots[:i])
            dx = (await self._buffer(("dx", micro_batch, i), rows * features)).ref \
                if need_dx else None
            slot = self.slots[i]
            params = self.params[slot.bucket].ref if slot is not None else None
            grads = self.grads[slot.bucket].ref if slot is not None else None
            coros += [self._run(op) for op in backward_ops(
                layer, tape.inputs[i], dy, dx, rows, features, params, grads, slot,
                tape.saved[i])]
            if slot is not None and bucket_ready is not None:
                position = last - slot.bucket
                coros.append(partial(_call_soon, bucket_ready, position))
            if dx is None:
                return coros, None
            dy = dx
        return coros, dy

    async def backward_async(self, grad_out: Any = None, *, micro_batch: int = 0,
                             want_input_grad: bool = False,
                             bucket_ready: Callable[[int], None] | None = None,
                             ) -> GpuBuffer | None:
        """Backpropagate the last forward of ``micro_batch``: ``grad_out`` None (from the
        loss), a NumPy array or a ``GpuBuffer`` shaped like the output. Parameter gradients
        are **added** to the gradient buckets. Answers the input's gradient when
        ``want_input_grad`` (a buffer whose first elements hold it in the input's shape,
        valid until the next backward of this ``micro_batch``), else None.
        ``bucket_ready(i)`` is called once the ops completing ``gradient_buckets[i]`` are
        submitted (see the module docstring)."""
        coros, dx = await self._backward_ops(grad_out, micro_batch, want_input_grad,
                                             bucket_ready)
        await gather(coros)
        if not want_input_grad:
            return None
        tape = self._tape(micro_batch)
        assert dx is not None
        return self._device_buffer(dx, tape.keep)

    backward = twin(backward_async, on_loop=True)

    # ------------------------------------------------- the trainer's step

    async def _gradient_ops(self, x: Any, y: Any, *, grad_scale: float, zero: bool,
                            micro_batch: int, bucket_ready: Callable[[int], None] | None,
                            loss_sum: GpuRef | None = None, draw: int = 0) -> list[Thunk]:
        """Zero (when ``zero``), forward, loss (with ``loss_sum``: ``rows * loss`` added into
        its first element on the device) and backward of one batch, as calls in order
        (``draw``: as for ``_forward_ops``)."""
        forward, tape = await self._forward_ops(x, micro_batch, True, None, draw)
        loss = await self._loss_ops(y, micro_batch, grad_scale)
        if loss_sum is not None:
            assert self._loss_buffer is not None
            loss.append(self._run(Axpy(1, float(tape.rows), self._loss_buffer.ref, loss_sum)))
        backward, _ = await self._backward_ops(None, micro_batch, False, bucket_ready)
        return [*(self._zero_ops() if zero else ()), *forward, *loss, *backward]

    async def gradient_phase_ops(self, batches: Sequence[MicroBatch], *,
                                 bucket_ready: Callable[[int], None]) -> list[Thunk]:
        """A trainer step's first half (``finish_step_ops`` is the second), as calls to
        start in order, nothing read back: the upload of the coming update's ``hyper``
        values (where it has any: ``finish_step_ops`` reads them), zero ``step_stats``,
        then ``gradient_step``'s
        ops for each micro-batch (the first zeroes), ``rows * loss`` added into
        ``step_stats[0]`` on the device; ``bucket_ready`` in the last micro-batch, and for
        every bucket again at the end (the gradients are zeroed when there is none)."""
        stats = self._stats = await self._buffer(("stats",), STATS_LENGTH)
        await self._hyper()
        coros: list[Thunk] = [*self._hyper_uploads(), self._run(FillZeros(stats.ref))]
        if not batches:
            coros += self._zero_ops()
        for number, batch in enumerate(batches):
            last = number == len(batches) - 1
            coros += await self._gradient_ops(
                batch.x, batch.y, grad_scale=batch.grad_scale, zero=number == 0,
                micro_batch=0, bucket_ready=bucket_ready if last else None,
                loss_sum=stats.ref, draw=number)
        coros += [partial(_call_soon, bucket_ready, i) for i in range(len(self.grads))]
        return coros

    async def gradient_step_async(self, x: Any, y: Any, *, grad_scale: float = 1.0,
                                  zero: bool = True, micro_batch: int = 0,
                                  bucket_ready: Callable[[int], None] | None = None,
                                  ) -> float:
        """Zero the gradients (unless ``zero`` is False: they accumulate), forward ``x``,
        take the loss against ``y`` (its gradient times ``grad_scale``) and backward, all
        submitted back to back and awaited once; no update. Answers the loss.
        ``bucket_ready`` as for ``backward_async``: what a data-parallel trainer needs
        between backward and the update (its all-reduce)."""
        require_real("grad_scale", grad_scale)
        coros = await self._gradient_ops(x, y, grad_scale=float(grad_scale), zero=zero,
                                         micro_batch=micro_batch, bucket_ready=bucket_ready)
        coros.append(self._read_loss)
        results = await gather(coros)
        return float(results[-1])

    gradient_step = twin(gradient_step_async, on_loop=True)

    async def train_step_async(self, x: Any, y: Any) -> float:
        """Zero the gradients, forward ``x``, take the loss against ``y``, backward, update;
        all submitted back to back and awaited once. Answers the loss (before the update)."""
        await self._hyper()
        coros = await self._gradient_ops(x, y, grad_scale=1.0, zero=True, micro_batch=0,
                                         bucket_ready=None)
        uploads = self._hyper_uploads()
        coros += [*self._update_ops(1.0), self._read_loss]
        results = await gather([*uploads, *coros])
        return float(results[-1])

    train_step = twin(train_step_async, on_loop=True)

    async def predict_async(self, x: Any) -> Array:
        """The model's output for ``x`` in evaluation mode, as a host array."""
        coros, tape = await self._forward_ops(x, _PREDICT, False, None)
        coros.append(partial(self.device.copy_to_numpy_async,
            tape.output, 0, math.prod(tape.shapes[-1]), timeout_secs=self._timeout))
        results = await gather(coros)
        out: Array = results[-1].reshape(tape.shapes[-1])
        return out

    predict = twin(predict_async, on_loop=True)

_PREDICT = 2**62
"""The micro-batch tag of ``predict`` (apart from the training tags)."""


async def _call_soon(fn: Callable[[int], None], position: int) -> None:
    fn(position)
