"""``TorchReplica``: one device's copy of a ``TorchModule``, driven by the data-parallel
trainer like a ``ModelReplica`` (see ``_torch_module`` for the design).

The user's module runs as user code: whatever its forward or backward raises
(``SystemExit``, a stray ``CancelledError``, a ``ValueError``, ...) fails the step with a
typed error (``UserCodeError``, ``FunctionFailed``) and never ends the trainer's tasks,
its replicas or its loop."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.actor import user_code
from atomr_accel.core._errors import (
    FunctionFailed,
    GpuRuntimeError,
    InvalidArgument,
    UserCodeError,
)
from atomr_accel.core._op import Op, validated
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dlpack import ExternalWrite
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.core.ops._train import STATS_LENGTH, GradCheck
from atomr_accel.facade import Device
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._dp_replica import MicroBatch
from atomr_accel.train._model import Array
from atomr_accel.train._optim import SGD, Adam, AdamW, CrossEntropyLoss, Loss, Optimizer
from atomr_accel.train._replica_state import Thunk, start_now
from atomr_accel.train._torch_batches import BatchUploads
from atomr_accel.train._torch_module import TorchModule, import_torch

__all__ = ["TorchReplica"]


@contextlib.contextmanager
def _user_module(what: str) -> Iterator[None]:
    """Around a call into the user's module: what it raises answers the call as a typed
    error (``UserCodeError`` for a ``SystemExit`` and its kin, ``FunctionFailed`` for any
    other exception not of this package), so the step fails and the trainer keeps its
    replicas."""
    try:
        with user_code(what, UserCodeError):
            yield
    except GpuRuntimeError:
        raise
    except Exception as exc:
        raise FunctionFailed.of(what, exc) from exc


@dataclass(slots=True)
class _Bucket:
    """One flat gradient bucket: our buffer, the torch tensor over it (on the CPU backend
    a host tensor copied to and from it), its parameters, how many still owe their
    gradient in the backward in flight, and (the trainer's step on CUDA) the event
    recorded once the last of them has."""

    buffer: GpuBuffer
    flat: Any
    params: list[Any]
    pending: int
    done: asyncio.Future[Any]
    event: Any = None


class TorchReplica:
    """A ``TorchModule``'s copy on one device: forward and backward in torch, gradients
    in our flat buffers (``gradient_buckets``), torch's optimizer step.

    ``loss_async`` launches backward as well (so the buckets fill, and their
    all-reduce starts, as early as possible); ``backward_async`` then hands on
    each bucket once torch has finished it.

    The trainer's step on CUDA (``gradient_phase_ops``) waits for nothing on the
    host: one worker-thread call queues the uploads, forwards, losses (their sum
    written into ``step_stats`` by torch) and backwards, the hooks record an event
    where each bucket's last gradient is queued, and once backward has queued all,
    every bucket is handed on with an ``ExternalWrite`` of its event, so that its
    all-reduce waits for that point of torch's stream on the device (the device
    is then still running the backward: the all-reduces overlap it).
    """

    def __init__(self, device: Device, module: Any, loss: Loss, optimizer: Optimizer,
                 buckets: list[_Bucket], names: list[str], stats: GpuBuffer,
                 stats_view: Any) -> None:
        self._device = device
        self._stats = stats
        self._stats_view = stats_view
        self._phase: asyncio.Future[None] | None = None
        self._armed = False
        self._queued = False
        check: Op = GradCheck(tuple(b.buffer.ref for b in buckets), stats.ref)
        if OpSequence.library in device.config.libraries:
            check = OpSequence((check,))
        self._check = validated(check)
        """The step's check, as one kept sequence where the device runs sequences: on CUDA
        it is then replayed as one CUDA graph launch once it repeats."""
        self.torch = import_torch()
        self.module = module
        self.loss = loss
        self.optimizer_spec = optimizer
        self.buckets = buckets
        self.names = names
        self.cuda = device.config.capabilities.device_memory
        self.torch_device = next(module.parameters()).device
        self.steps = 0
        self.output: Any = None
        self.optimizer = _torch_optimizer(self.torch, optimizer,
                                          [p for b in buckets for p in b.params], self.cuda)
        self._uploads = BatchUploads(self.torch, self.torch_device)
        self._loop = asyncio.get_running_loop()
        self._register_hooks()

    def _register_hooks(self) -> None:
        """A hook on every parameter, run once its gradient is accumulated (queued)."""
        for index, bucket in enumerate(self.buckets):
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self._hook(index))

    @classmethod
    async def create_async(cls, device: Device, model: TorchModule, *, loss: Loss,
                           optimizer: Optimizer) -> TorchReplica:
        """A replica of ``model`` on ``device`` (CUDA: thread host only, so that torch and
        the device share one address space)."""
        torch = import_torch()
        cuda = device.config.capabilities.device_memory
        if cuda and device.isolation != "thread":
            raise InvalidArgument("a TorchModule shares its gradients with the device through "
                                  "one address space: spawn CUDA devices with "
                                  "isolation='thread'")
        where = torch.device(f"cuda:{device.device_id}" if cuda else "cpu")
        with _user_module("TorchModule copy"):
            module = model.copy_module().to(where)
        module.train()
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        groups: list[list[tuple[str, Any]]] = [[]]
        size = 0
        for name, p in reversed(named):  # backward fills the last parameters first
            if groups[-1] and (size + p.numel()) * 4 > model.bucket_bytes:
                groups.append([])
                size = 0
            groups[-1].append((name, p))
            size += p.numel()
        loop = asyncio.get_running_loop()
        buckets: list[_Bucket] = []
        for group in groups:
            count = sum(p.numel() for _, p in group)
            buffer = await device.allocate_async(count, "f32")
            flat = (await _alias(device, buffer, torch) if cuda
                    else torch.zeros(count, dtype=torch.float32))
            offset = 0
            for _, p in group:
                p.grad = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
            done: asyncio.Future[Any] = loop.create_future()
            buckets.append(_Bucket(buffer, flat, [p for _, p in group], len(group), done))
        names = [n for group in groups for n, _ in group]
        stats = await device.allocate_async(STATS_LENGTH, "f32")
        stats_view = await _alias(device, stats, torch) if cuda else None
        return cls(device, module, loss, optimizer, buckets, names, stats, stats_view)

    # ------------------------------------------------------------------ the trainer's calls

    @property
    def device(self) -> Device:
        """The device the replica lives on."""
        return self._device

    @property
    def gradient_buckets(self) -> list[GpuBuffer]:
        """Our flat gradient buffers, in the order backward fills them."""
        return [b.buffer for b in self.buckets]

    async def zero_grad_async(self) -> None:
        """Zero every gradient (torch's ``.grad`` views of the buckets)."""
        await asyncio.to_thread(self._zero)

    def _zero(self) -> None:
        for bucket in self.buckets:
            bucket.flat.zero_()

    def _arm(self) -> None:
        """New completion futures for the next backward, once the last one's were used;
        the hooks count down from now on."""
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            if bucket.done.done():
                bucket.done = self._loop.create_future()
        self._armed = True

    async def forward_async(self, x: Any, *, train: bool = True, micro_batch: int = 0) -> Any:
        """Run the module on ``x`` (kept for ``loss_async``)."""
        del micro_batch
        self.module.train(train)
        with _user_module("TorchModule forward"):
            self.output = await asyncio.to_thread(self._forward, x)
        return self.output

    def _forward(self, x: Any) -> Any:
        inputs = self._uploads.to_device("x", np.ascontiguousarray(x, dtype=np.float32))
        return self.module(inputs)

    async def loss_async(self, y: Any, *, micro_batch: int = 0,
                         grad_scale: float = 1.0) -> float:
        """The mean loss of the last forward against ``y``; also launches its backward
        (the loss times ``grad_scale``), whose buckets ``backward_async`` hands on."""
        del micro_batch
        self._arm()
        with _user_module("TorchModule loss and backward"):
            value = await asyncio.to_thread(self._loss_backward, y, float(grad_scale))
        for index, bucket in enumerate(self.buckets):
            if not bucket.done.done():  # parameters the forward did not use
                self._settle(index, self._event())
        return value

    def _loss_backward(self, y: Any, grad_scale: float) -> float:
        out = self.output
        loss = self._loss_of(out, self._target(y))
        self.output = None
        if not self.cuda:
            value = float(loss.item())
            (loss * grad_scale).backward()
            return value
        host = loss.detach().to("cpu", non_blocking=True)
        computed = self._event()  # before backward's kernels: the loss alone is waited for
        (loss * grad_scale).backward()
        computed.synchronize()
        return float(host)

    def _target(self, y: Any) -> Any:
        """``y`` on the module's device: labels (int64) or targets (f32)."""
        labels = isinstance(self.loss, CrossEntropyLoss)
        data = np.ascontiguousarray(y, dtype=np.int64 if labels else np.float32)
        return self._uploads.to_device("y", data)

    def _loss_of(self, out: Any, target: Any) -> Any:
        """The mean loss of ``out`` against ``target`` (as ``_target`` gave it)."""
        functional = self.torch.nn.functional
        if isinstance(self.loss, CrossEntropyLoss):
            return functional.cross_entropy(out, target.reshape(-1),
                                            label_smoothing=self.loss.label_smoothing)
        return functional.mse_loss(out, target.reshape(out.shape))

    async def backward_async(self, grad_out: Any = None, *, micro_batch: int = 0,
                             want_input_grad: bool = False,
                             bucket_ready: Callable[[int], None] | None = None) -> None:
        """Hand on the buckets of the backward ``loss_async`` launched, in the order it
        fills them: each, once torch has finished it (CUDA: its event; CPU: copied into
        our buffer), is passed to ``bucket_ready``. Only gradients from the loss."""
        if grad_out is not None or want_input_grad:
            raise InvalidArgument("a TorchModule replica backpropagates from its loss only")
        del micro_batch
        for index, bucket in enumerate(self.buckets):
            event = await bucket.done
            if event is not None:
                await asyncio.to_thread(event.synchronize)
            else:
                await self._device.copy_from_numpy_async(bucket.buffer, bucket.flat.numpy())
            if bucket_ready is not None:
                bucket_ready(index)

    async def gradient_step_async(self, x: Any, y: Any, *, grad_scale: float = 1.0,
                                  zero: bool = True, micro_batch: int = 0,
                                  bucket_ready: Callable[[int], None] | None = None,
                                  ) -> float:
        """``zero_grad_async`` (when ``zero``), ``forward_async``, ``loss_async`` and
        ``backward_async`` in turn; answers the loss."""
        if zero:
            await self.zero_grad_async()
        await self.forward_async(x, micro_batch=micro_batch)
        value = await self.loss_async(y, micro_batch=micro_batch, grad_scale=grad_scale)
        await self.backward_async(micro_batch=micro_batch, bucket_ready=bucket_ready)
        return value

    @property
    def step_stats(self) -> GpuBuffer:
        """The step's ``[loss_sum, grad_sumsq, apply_flag]`` (f32; see
        ``ModelReplica.step_stats``)."""
        return self._stats

    async def gradient_phase_ops(self, batches: Sequence[MicroBatch], *,
                                 bucket_ready: Callable[[int], None]) -> list[Thunk]:
        """``ModelReplica.gradient_phase_ops`` with this replica's own calls, as one call:
        torch's losses come back to the host, and their sum goes to ``step_stats``
        before the last backward hands its buckets on."""
        done = self._phase = self._loop.create_future()

        async def phase() -> None:
            try:
                await self._gradient_phase(batches, bucket_ready)
            except BaseException as exc:
                if isinstance(exc, Exception):
                    done.set_exception(exc)
                    done.exception()  # retrieved: the second half may never wait on it
                else:
                    done.cancel()
                raise
            done.set_result(None)

        return [phase]

    async def _gradient_phase(self, batches: Sequence[MicroBatch],
                              bucket_ready: Callable[[int], None]) -> None:
        if self.cuda:
            await self._queued_phase(batches, bucket_ready)
            return
        if not batches:
            await self.zero_grad_async()
            await self._put_stats(0.0)
        loss_sum = 0.0
        for number, batch in enumerate(batches):
            last = number == len(batches) - 1
            if number == 0:
                await self.zero_grad_async()
            await self.forward_async(batch.x)
            loss_sum += len(batch.x) * await self.loss_async(batch.y,
                                                             grad_scale=batch.grad_scale)
            if last:
                await self._put_stats(loss_sum)
            await self.backward_async(bucket_ready=bucket_ready if last else None)
        for index in range(len(self.buckets)):
            bucket_ready(index)

    async def _queued_phase(self, batches: Sequence[MicroBatch],
                            bucket_ready: Callable[[int], None]) -> None:
        """The gradient phase on CUDA, with no host wait (class doc)."""
        for bucket in self.buckets:  # the hooks count down once the last backward comes
            bucket.pending, bucket.event = len(bucket.params), None
        self._armed, self._queued = False, True
        try:
            with _user_module("TorchModule step"):
                await asyncio.to_thread(self._queue_phase, batches)
        finally:
            self._armed = self._queued = False
        handed = []
        last = len(self.buckets) - 1
        for index, bucket in enumerate(self.buckets):
            event = bucket.event
            if event is None:  # parameters the forward did not use
                event = self._event()
            written: tuple[GpuRef, ...] = (bucket.buffer.ref,)
            if index == last:  # the all-reduce of the last bucket sums the stats too
                written += (self._stats.ref,)
            handed.append(start_now(self._device.run_async(ExternalWrite(written, event))))
            bucket_ready(index)
        await asyncio.gather(*handed)

    def _queue_phase(self, batches: Sequence[MicroBatch]) -> None:
        """Zero the gradients, then each micro-batch's forward, loss and backward (the
        loss times its ``grad_scale``); the losses' sum (each mean times its rows) goes
        to ``step_stats`` before the last backward, whose hooks record the buckets' events."""
        self.module.train(True)
        self._zero()
        total: Any = None
        for number, batch in enumerate(batches):
            x = self._uploads.to_device("x", np.ascontiguousarray(batch.x, dtype=np.float32))
            out = self.module(x)
            loss = self._loss_of(out, self._target(batch.y))  # y's copy fills meanwhile
            part = loss.detach() * len(batch.x)
            total = part if total is None else total + part
            if number == len(batches) - 1:
                self._write_stats(total)
            (loss * batch.grad_scale).backward()
        if not batches:
            self._write_stats(None)

    def _write_stats(self, total: Any) -> None:
        """``step_stats`` = [total, 0, 0] on torch's stream; the hooks count from now."""
        self._stats_view.zero_()
        if total is not None:
            self._stats_view[:1].copy_(total.reshape(1))
        self._armed = True

    async def _put_stats(self, loss_sum: float) -> None:
        values = np.zeros(STATS_LENGTH, np.float32)
        values[0] = loss_sum
        await self._device.copy_from_numpy_async(self._stats, values)

    def finish_step_ops(self) -> list[Thunk]:
        """``ModelReplica.finish_step_ops`` with this replica's own calls, as one call
        (which first waits for the first half's when both are started together):
        ``GradCheck`` on the device, the download of ``step_stats``, then torch's
        optimizer step where its flag is set."""
        return [self._finish_step]

    async def _finish_step(self) -> Array:
        if self._phase is not None:
            await self._phase  # the first half's error, if it failed
        # Both on their way at once, in this order: the download reads what the check
        # wrote, so the device runs it behind the check, and one wait covers both.
        check = start_now(self._device.run_async(self._check, checked=True))
        download = start_now(self._device.copy_to_numpy_async(self._stats))
        answers = await asyncio.gather(check, download, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        stats: Array = answers[1]
        if stats[2] != 0:
            await self.optimizer_step_async()
        return stats

    def _hook(self, index: int) -> Any:
        def hook(_: Any) -> None:
            if not self._armed:
                return
            bucket = self.buckets[index]
            bucket.pending -= 1
            if bucket.pending:
                return
            if self._queued:
                bucket.event = self._event()
            else:
                self._loop.call_soon_threadsafe(self._settle, index, self._event())
        return hook

    def _event(self) -> Any:
        if not self.cuda:
            return None
        event = self.torch.cuda.Event()
        event.record(self.torch.cuda.current_stream(self.torch_device))
        return event

    def _settle(self, index: int, event: Any) -> None:
        done = self.buckets[index].done
        if not done.done():
            done.set_result(event)

    async def optimizer_step_async(self, *, grad_scale: float = 1.0) -> None:
        """Torch's optimizer step on the all-reduced gradients, at the schedule's rate."""
        if not self.cuda:
            for bucket in self.buckets:
                data = await self._device.copy_to_numpy_async(bucket.buffer)
                bucket.flat.copy_(self.torch.from_numpy(np.ascontiguousarray(data)))
        lr = self.optimizer_spec.lr_at(self.steps)
        await asyncio.to_thread(self._step, lr, grad_scale)
        self.steps += 1

    def _step(self, lr: float, grad_scale: float) -> None:
        if grad_scale != 1.0:
            for bucket in self.buckets:
                bucket.flat.mul_(grad_scale)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()

    async def predict_async(self, x: Any) -> Array:
        """The module's output on ``x`` in evaluation mode, as a NumPy array."""
        with _user_module("TorchModule forward"):
            return await asyncio.to_thread(self._predict, x)

    def _predict(self, x: Any) -> Array:
        torch = self.torch
        self.module.eval()
        try:
            with torch.no_grad():
                out = self.module(torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
                                  .to(self.torch_device))
            result: Array = out.float().cpu().numpy()
            return result
        finally:
            self.module.train()

    async def state_dict_async(self) -> dict[str, Array]:
        """The module's ``state_dict``, the optimizer's per-parameter state
        (``"<name>.<state>"``) and ``"step"``, as NumPy arrays."""
        return await asyncio.to_thread(self._state)

    def _state(self) -> dict[str, Array]:
        state = {k: v.detach().cpu().numpy().copy()
                 for k, v in self.module.state_dict().items()}
        by_param = dict(zip(self._params(), self.names, strict=True))
        for p, values in self.optimizer.state.items():
            for key, value in values.items():
                if value is None:
                    continue
                tensor = self.torch.as_tensor(value)
                state[f"{by_param[p]}.{key}"] = tensor.detach().cpu().numpy().copy()
        state["step"] = np.asarray(self.steps, dtype=np.int64)
        return state

    async def load_state_dict_async(self, state: Mapping[str, Any]) -> None:
        """Take a state as ``state_dict_async`` answers it."""
        await asyncio.to_thread(self._load, state)

    def _load(self, state: Mapping[str, Any]) -> None:
        torch = self.torch
        own = self.module.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise InvalidArgument(f"the state lacks {missing[:4]}")
        with torch.no_grad():
            for key, tensor in own.items():
                tensor.copy_(torch.as_tensor(state[key]))
        for p, name in zip(self._params(), self.names, strict=True):
            prefix = f"{name}."
            slots = {key.removeprefix(prefix): value for key, value in state.items()
                     if key.startswith(prefix) and key not in own}
            if slots:
                self.optimizer.state[p] = {k: self._slot_tensor(k, v, p)
                                           for k, v in slots.items()}
        self.steps = int(state.get("step", np.asarray(0)))

    def _slot_tensor(self, key: str, value: Array, param: Any) -> Any:
        """An optimizer state tensor where torch keeps it: ``step`` a float32 scalar (on
        the parameter's device for the fused CUDA optimizers), the rest beside the
        parameter."""
        torch = self.torch
        if key == "step":
            where = param.device if self.cuda else "cpu"
            return torch.tensor(float(value), dtype=torch.float32, device=where)
        return torch.as_tensor(np.array(value)).to(param.device)

    def _params(self) -> list[Any]:
        return [p for b in self.buckets for p in b.params]


def _torch_optimizer(torch: Any, spec: Optimizer, params: list[Any], cuda: bool) -> Any:
    """Torch's optimizer with ``spec``'s hyperparameters (fused kernels on CUDA)."""
    fast = {"fused": True} if cuda else {"foreach": False}
    if isinstance(spec, SGD):
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum,
                               nesterov=spec.nesterov, weight_decay=spec.weight_decay, **fast)
    if isinstance(spec, AdamW):
        return torch.optim.AdamW(params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
                                 weight_decay=spec.weight_decay, **fast)
    if isinstance(spec, Adam):
        return torch.optim.Adam(params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
                                weight_decay=spec.weight_decay, **fast)
    raise InvalidArgument(f"no torch optimizer for {spec!r}")


async def _alias(device: Device, buffer: GpuBuffer, torch: Any) -> Any:
    """A torch tensor over ``buffer``'s device memory (same process), through DLPack."""
    cupy = importlib.import_module("cupy")
    address = await device.buffer_address_async(buffer)
    with cupy.cuda.Device(device.device_id):
        memory = cupy.cuda.UnownedMemory(address, len(buffer) * 4, buffer, device.device_id)
        array = cupy.ndarray((len(buffer),), cupy.float32, cupy.cuda.MemoryPointer(memory, 0))
        return torch.from_dlpack(array)
