"""ONNX models on a device: ``dev.onnx()`` is an ``Onnx`` handle whose ``load`` gives an
``OnnxEngine``.

An engine runs its model with ONNX Runtime in the device's context: on a CUDA
device with the CUDA execution provider on the ``onnx`` kernel actor's stream,
device buffers bound by pointer; on the CPU backend with the CPU provider.
Inputs are NumPy arrays or buffers (with their shapes); outputs come back as
NumPy arrays, or are written into buffers. Every input is checked against the
model's signature in the caller (``InvalidArgument``, ``DTypeMismatch``)
before the device is touched. Sessions are cached per context: a rebuilt
context has none, and the engine's next call loads the model again. ONNX
Runtime is optional: ``pip install 'atomr-accel-py[onnx]'`` (``onnxruntime-gpu``
for the CUDA provider); without it loading raises ``LibraryUnavailable``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.core._op import validated
from atomr_accel.core.ops._libraries import LibraryAvailable
from atomr_accel.core.ops._onnx import (
    DeviceTensor,
    LoadOnnxModel,
    ModelNotLoaded,
    OnnxModelInfo,
    OnnxTensorInfo,
    RunOnnxModel,
    UnloadOnnxModel,
)
from atomr_accel.facade._bound import check_timeout
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._host_arrays import host_array
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._portal import blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Onnx", "OnnxEngine"]

Tensor = Any
"""An input: host data (a NumPy array, a torch tensor, anything ``copy_from_numpy`` takes), a
buffer (its model shape must be fixed), or ``(buffer, shape)``."""
Output = GpuBuffer | tuple[GpuBuffer, Sequence[int]]
"""Where an output goes on the device: a buffer (fixed model shape) or ``(buffer, shape)``."""


def model_bytes(model: Any) -> bytes:
    """The serialized model: ``bytes`` as they are, a file path read, or an ``onnx``
    ``ModelProto`` serialized (``InvalidArgument`` for anything else or an unreadable file)."""
    if isinstance(model, bytes | bytearray | memoryview):
        return bytes(model)
    if isinstance(model, str | os.PathLike):
        try:
            with open(model, "rb") as f:
                return f.read()
        except OSError as exc:
            raise InvalidArgument(f"cannot read the model file {model!r}: {exc}") from exc
    serialize = getattr(model, "SerializeToString", None)
    if callable(serialize):
        return bytes(serialize())
    raise InvalidArgument("model must be bytes, a path to an .onnx file or an onnx ModelProto, "
                          f"got {type(model).__name__}")


def _fits(info: OnnxTensorInfo, shape: tuple[int, ...], what: str) -> None:
    """Require ``shape`` to match the model's rank and fixed dimensions of ``info``."""
    if len(shape) != len(info.shape) or any(
            want is not None and want != got for want, got in zip(info.shape, shape, strict=True)):
        wanted = tuple("?" if d is None else d for d in info.shape)
        raise InvalidArgument(f"{what} {info.name!r} has shape {shape}; the model takes "
                              f"{wanted} ('?': any size)")


def _dtype(info: OnnxTensorInfo, got: np.dtype[Any], what: str) -> None:
    if got.name != info.dtype:
        raise DTypeMismatch(f"{what} {info.name!r} has dtype {got.name}; the model takes "
                            f"{info.dtype}")


class OnnxEngine(Library):
    """A loaded ONNX model on one device (``Onnx.load``); blocking methods with ``_async``
    twins.

    ``input_names`` / ``output_names`` and ``info`` (shapes and dtypes; None
    for a free dimension) describe the model. ``run(inputs, output_names=None,
    outputs=None)`` takes a dict of inputs by name (host arrays, buffers, or
    ``(buffer, shape)``) and answers a dict of host arrays: the outputs named
    (default: every output not written into a buffer by ``outputs``, a dict of
    output name -> buffer or ``(buffer, shape)``). ``batch_fn()`` makes a
    batch function for ``DynamicBatchingServer``. ``close`` drops the session.
    """

    def __init__(self, device: Device, info: OnnxModelInfo, load: LoadOnnxModel) -> None:
        super().__init__(device)
        self.info = info
        """The model's digest, inputs, outputs and the providers its session runs on."""
        self._load_op = load
        self._inputs = {t.name: t for t in info.inputs}
        self._outputs = {t.name: t for t in info.outputs}
        self._closed = False

    @property
    def input_names(self) -> list[str]:
        """The model's input names, in its order."""
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        """The model's output names, in its order."""
        return list(self._outputs)

    @property
    def providers(self) -> tuple[str, ...]:
        """The ONNX Runtime execution providers its session runs on."""
        return self.info.providers

    def _device_tensor(self, info: OnnxTensorInfo, value: Any, what: str) -> DeviceTensor:
        buffer, shape = (value if isinstance(value, tuple) else (value, None))
        if not isinstance(buffer, GpuBuffer):
            raise InvalidArgument(f"{what} {info.name!r} must be a buffer or (buffer, shape), "
                                  f"got {type(buffer).__name__}")
        if shape is None:
            if any(d is None for d in info.shape):
                raise InvalidArgument(f"{what} {info.name!r} has a free dimension: pass "
                                      "(buffer, shape)")
            shape = info.shape
        if not all(isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0
                   for d in shape):
            raise InvalidArgument(f"the shape of {what} {info.name!r} must be non-negative ints, "
                                  f"got {shape!r}")
        dims = tuple(int(d) for d in shape)
        _fits(info, dims, what)
        _dtype(info, buffer.dtype.numpy, what)
        tensor = DeviceTensor(self.device.ref_of(buffer, f"{what} {info.name!r}"), dims)
        tensor.validate()
        return tensor

    def _op(self, inputs: Mapping[str, Tensor], output_names: Sequence[str] | None,
            outputs: Mapping[str, Output] | None) -> RunOnnxModel:
        """The checked run op of a call (see ``run``)."""
        if self._closed:
            raise InvalidArgument("this OnnxEngine is closed")
        if not isinstance(inputs, Mapping):
            raise InvalidArgument(f"inputs must be a dict of input name -> tensor, "
                                  f"got {type(inputs).__name__}")
        feeds: list[tuple[str, Any]] = []
        for name, value in inputs.items():
            info = self._inputs.get(name)
            if info is None:
                raise InvalidArgument(f"the model has no input {name!r}; its inputs are "
                                      f"{self.input_names}")
            if not isinstance(value, GpuBuffer | tuple):  # host data: NumPy, torch, DLPack
                array = host_array(value, f"input {name!r}")
                _dtype(info, array.dtype, "input")
                _fits(info, array.shape, "input")
                feeds.append((name, array))
            else:
                feeds.append((name, self._device_tensor(info, value, "input")))
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise InvalidArgument(f"inputs {missing} are missing")
        into = []
        for name, value in (outputs or {}).items():
            info = self._outputs.get(name)
            if info is None:
                raise InvalidArgument(f"the model has no output {name!r}; its outputs are "
                                      f"{self.output_names}")
            into.append((name, self._device_tensor(info, value, "output")))
        if output_names is None:
            fetch = tuple(n for n in self._outputs if n not in (outputs or {}))
        else:
            if isinstance(output_names, str):
                raise InvalidArgument("output_names must be a list of names, not one str")
            fetch = tuple(output_names)
            unknown = [n for n in fetch if n not in self._outputs]
            if unknown:
                raise InvalidArgument(f"the model has no outputs {unknown}; its outputs are "
                                      f"{self.output_names}")
        return validated(RunOnnxModel(self.info.digest, tuple(feeds), fetch, tuple(into)))

    def run_async(self, inputs: Mapping[str, Tensor], output_names: Sequence[str] | None = None,
                  *, outputs: Mapping[str, Output] | None = None,
                  timeout_secs: float | None = None,
                  ) -> Coroutine[Any, Any, dict[str, np.ndarray[Any, Any]]]:
        """Run the model once and answer ``{output name: host array}`` (see the class).

        Raises ``InvalidArgument`` for an unknown, missing or misshapen input or
        output and ``DTypeMismatch`` for a wrong dtype, before the device is touched.
        """
        check_timeout(timeout_secs)
        return self._run_op(self._op(inputs, output_names, outputs), timeout_secs)

    async def _run_op(self, op: RunOnnxModel, timeout: float | None,
                      ) -> dict[str, np.ndarray[Any, Any]]:
        try:
            result: dict[str, np.ndarray[Any, Any]] = await self._run(op, timeout, checked=True)
        except ModelNotLoaded:  # the context was rebuilt since the load: load it again
            await self._load(timeout)
            result = await self._run(op, timeout, checked=True)
        return result

    async def _load(self, timeout: float | None) -> None:
        self.info = await self._run(self._load_op, timeout, checked=True)

    run = blocking(run_async)

    def batch_fn(self, input_name: str | None = None, output_name: str | None = None,
                 *, timeout_secs: float | None = None,
                 ) -> Callable[[list[np.ndarray[Any, Any]]], Coroutine[Any, Any, Any]]:
        """A batch function for ``DynamicBatchingServer``: it stacks the requests (one sample
        each, a host array without the batch axis) along a new first axis into the input
        ``input_name`` (default: the only input), runs the model once and answers each
        request its row of ``output_name`` (default: the first output)."""
        if input_name is None:
            if len(self._inputs) != 1:
                raise InvalidArgument(f"the model has inputs {self.input_names}: name one")
            input_name = self.input_names[0]
        output_name = self.output_names[0] if output_name is None else output_name
        for name, known in ((input_name, self._inputs), (output_name, self._outputs)):
            if name not in known:
                raise InvalidArgument(f"the model has no tensor {name!r}")
        check_timeout(timeout_secs)
        chosen_input, chosen_output = input_name, output_name

        async def run_batch(items: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
            batch = np.stack(items)
            result = await self.run_async({chosen_input: batch}, [chosen_output],
                                          timeout_secs=timeout_secs)
            return result[chosen_output]

        return run_batch

    def close_async(self, timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Drop the model's session from the context; later runs raise ``InvalidArgument``.
        (Another engine of the same model bytes reloads it on its next run.)"""
        self._closed = True
        return self._submit(UnloadOnnxModel(self.info.digest), timeout_secs)

    close = blocking(close_async)

    def __repr__(self) -> str:
        return (f"OnnxEngine(device={self.device.device_id}, inputs={self.input_names}, "
                f"outputs={self.output_names}, providers={list(self.providers)})")


class Onnx(Library):
    """ONNX Runtime on one device (``dev.onnx()``): ``load`` a model into an ``OnnxEngine``."""

    def is_available_async(self, timeout_secs: float | None = None,
                           ) -> Coroutine[Any, Any, bool]:
        """Whether ONNX Runtime can run in the device's context (``onnxruntime`` imports)."""
        return self._submit(LibraryAvailable("onnx"), timeout_secs)

    is_available = blocking(is_available_async)

    def load_async(self, model: Any, providers: Sequence[str] | None = None, *,
                   threads: int = 0, spinning: bool = False,
                   timeout_secs: float | None = None) -> Coroutine[Any, Any, OnnxEngine]:
        """Load ``model`` (bytes, a path, or an ``onnx.ModelProto``) into a session of the
        device's context and answer its engine. ``providers``: ONNX Runtime execution
        provider names (None: CUDA's on a CUDA device, the CPU's on the CPU backend).
        ``threads``: the CPU provider's intra-op threads (0: ONNX Runtime's default);
        ``spinning``: let idle ONNX Runtime threads spin (off: on a busy host spinning
        threads took the cores the requests needed; 64-row MLP calls ran 0.59 ms instead
        of 1.15 ms on a shared 2-core VM).

        Raises ``InvalidArgument`` for a model ONNX Runtime refuses and
        ``LibraryUnavailable`` where ``onnxruntime`` (or its CUDA provider) is missing.
        """
        check_timeout(timeout_secs)
        data = model_bytes(model)
        if isinstance(providers, str):
            raise InvalidArgument("providers must be a list of names, not one str")
        chosen = None if providers is None else tuple(providers)
        op = validated(LoadOnnxModel(data, chosen, threads, spinning))
        return self._loaded(op, timeout_secs)

    async def _loaded(self, op: LoadOnnxModel, timeout: float | None) -> OnnxEngine:
        info = await self._run(op, timeout, checked=True)
        return OnnxEngine(self.device, info, op)

    load = blocking(load_async)

    def __repr__(self) -> str:
        return f"Onnx(device={self.device.device_id})"
