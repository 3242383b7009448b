"""ONNX models on ONNX Runtime's CUDA execution provider, ordered on the op's stream.

A session's CUDA provider gets the op's stream as its ``user_compute_stream``,
so a model's kernels queue behind the work the backend ordered before it and
ahead of what follows; a model keeps one session per stream. Device tensors
are bound by pointer (``IOBinding.bind_input/bind_output`` on ``"cuda"``), so
they never pass through the host. A run whose outputs all go into buffers asks
ONNX Runtime not to synchronize (``disable_synchronize_execution_providers``):
the handler only queues work. Outputs answered to the host are copied there by
ONNX Runtime, which waits for the stream.

Without the CUDA provider (a CPU-only ``onnxruntime``), loading a model with
the default providers raises ``LibraryUnavailable`` naming ``onnxruntime-gpu``;
a model loaded with ``providers=["CPUExecutionProvider"]`` runs on the host,
its device tensors downloaded and its outputs uploaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.backends._handlers import cuda
from atomr_accel.backends._optional import require
from atomr_accel.backends.cpu import _onnx as shared
from atomr_accel.core._errors import InvalidArgument, LibraryUnavailable
from atomr_accel.core.ops._onnx import (
    DeviceTensor,
    LoadOnnxModel,
    OnnxModelInfo,
    RunOnnxModel,
)

__all__ = ["CUDA_PROVIDER", "load", "providers_for", "run"]

CUDA_PROVIDER = "CUDAExecutionProvider"


def _stream_pointer() -> int:
    import cupy as cp

    return int(cp.cuda.get_current_stream().ptr)


def providers_for(names: list[str], device_id: int, stream: int) -> list[Any]:
    """ONNX Runtime's providers for ``names``, the CUDA one set to this device and stream."""
    options = {"device_id": str(device_id), "user_compute_stream": str(stream)}
    return [(n, options) if n == CUDA_PROVIDER else n for n in names]


def _names(op: LoadOnnxModel) -> list[str]:
    """The providers asked for, or the CUDA provider's default (``LibraryUnavailable`` when
    this ONNX Runtime has none)."""
    if op.providers is not None:
        return list(op.providers)
    available = require("onnx").get_available_providers()
    if CUDA_PROVIDER not in available:
        raise LibraryUnavailable(
            "onnx", "onnxruntime-gpu", "onnx-gpu",
            f"this onnxruntime has no {CUDA_PROVIDER} (it has {', '.join(available)}); "
            f"or load with providers=['{shared.CPU_PROVIDER}'] to run on the host")
    return [CUDA_PROVIDER, shared.CPU_PROVIDER]


@cuda.handles(LoadOnnxModel)
def load(backend: Any, op: LoadOnnxModel) -> OnnxModelInfo:
    """Keep the model with a session on the op's stream and answer its info."""
    stream = _stream_pointer()
    return shared.load(backend, op, providers_for(_names(op), backend.device_id, stream), stream)


def _on_host(backend: Any, session: Any, op: RunOnnxModel) -> dict[str, np.ndarray[Any, Any]]:
    """Run a session without the CUDA provider: device tensors downloaded, outputs uploaded."""
    def view(tensor: DeviceTensor) -> Any:
        size = int(np.prod(tensor.shape))
        return backend.array(tensor.ref.buffer_id)[:size].reshape(tensor.shape)

    feed = {name: view(v).get() if isinstance(v, DeviceTensor) else v for name, v in op.feeds}
    names = [*op.fetch, *(name for name, _ in op.into)]
    try:
        results = session.run(names, feed)
    except Exception as exc:
        raise shared.translate(exc, "running the model") from exc
    for (name, tensor), result in zip(op.into, results[len(op.fetch):], strict=True):
        if tuple(result.shape) != tensor.shape:
            raise InvalidArgument(
                f"output {name!r} has shape {tuple(result.shape)}, not the {tensor.shape} its "
                "buffer was given")
        view(tensor).set(np.ascontiguousarray(result))
    return dict(zip(op.fetch, results[: len(op.fetch)], strict=True))


@cuda.handles(RunOnnxModel)
def run(backend: Any, op: RunOnnxModel) -> dict[str, np.ndarray[Any, Any]]:
    """Run with IO binding on the op's stream (see the module docstring)."""
    model = shared.model_of(backend, op.digest)
    stream = _stream_pointer()
    names = [p if isinstance(p, str) else p[0] for p in model.providers]
    session = shared.session_of(
        model, stream, lambda: providers_for(names, backend.device_id, stream))
    if CUDA_PROVIDER not in session.get_providers():
        return _on_host(backend, session, op)
    ort = require("onnx")
    device = backend.device_id
    binding = session.io_binding()
    for name, value in op.feeds:
        if isinstance(value, DeviceTensor):
            array = backend.array(value.ref.buffer_id)
            binding.bind_input(name, "cuda", device, array.dtype.type, list(value.shape),
                               array.data.ptr)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
    for name, tensor in op.into:
        array = backend.array(tensor.ref.buffer_id)
        binding.bind_output(name, "cuda", device, array.dtype.type, list(tensor.shape),
                            array.data.ptr)
    for name in op.fetch:
        binding.bind_output(name, "cpu")
    options = ort.RunOptions()
    if not op.fetch:  # every output stays on the device: only queue the work
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    try:
        session.run_with_iobinding(binding, options)
    except Exception as exc:
        raise shared.translate(exc, "running the model") from exc
    outputs = binding.get_outputs()[len(op.into):]
    return {name: value.numpy() for name, value in zip(op.fetch, outputs, strict=True)}
