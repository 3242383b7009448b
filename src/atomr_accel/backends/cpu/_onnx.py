"""ONNX models on ONNX Runtime's CPU execution provider, and the session store both backends
share.

Each context keeps its sessions in a ``Models`` (``models(backend)``, dropped
with the backend, so a rebuilt context starts empty) under the model's digest.
A model keeps its bytes and providers, and one session per CUDA stream (the
CUDA provider's ``user_compute_stream`` ties a session to one stream; the CPU
backend uses key 0). ONNX Runtime's own errors become typed ones
(``translate``): a bad argument is ``InvalidArgument``, the rest
``LibraryError("onnx", ...)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from atomr_accel.backends._handlers import cpu, shared
from atomr_accel.backends._optional import require
from atomr_accel.backends._state import per_backend
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, LibraryError
from atomr_accel.core.ops._onnx import (
    DeviceTensor,
    LoadOnnxModel,
    ModelNotLoaded,
    OnnxModelInfo,
    OnnxTensorInfo,
    RunOnnxModel,
    UnloadOnnxModel,
)

__all__ = ["CPU_PROVIDER", "Model", "Models", "info_of", "load", "model_of", "models",
           "run", "session_of", "translate", "unload"]

CPU_PROVIDER = "CPUExecutionProvider"

_ELEMENT_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int8)": "int8", "tensor(int16)": "int16", "tensor(int32)": "int32",
    "tensor(int64)": "int64", "tensor(uint8)": "uint8", "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
    "tensor(bfloat16)": "bfloat16",
}
"""ONNX Runtime's element type names -> NumPy dtype names."""


@dataclass
class Model:
    """A loaded model: its bytes, the providers asked for, its session options (threads,
    spinning) and its sessions by stream key."""

    data: bytes
    providers: list[Any]
    threads: int = 0
    spinning: bool = False
    sessions: dict[int, Any] = field(default_factory=dict)

    def options(self, ort: Any) -> Any:
        """ONNX Runtime's ``SessionOptions`` of this model."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        if not self.spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        return options


Models = dict[str, Model]
models: Callable[[Any], Models] = per_backend(dict)
"""The models of one backend (context), by digest."""


def translate(exc: Exception, what: str) -> GpuRuntimeError:
    """ONNX Runtime's error as ours: its INVALID_ARGUMENT (and a malformed model) as
    ``InvalidArgument``, anything else as ``LibraryError("onnx", <its name>, ...)``."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    kind = type(exc).__name__
    text = f"{what}: {exc}"
    if kind in ("InvalidArgument", "InvalidProtobuf", "InvalidGraph", "NoSuchFile",
                "NotImplemented") or "INVALID_ARGUMENT" in str(exc) \
            or "Shape mismatch" in str(exc):
        return InvalidArgument(f"onnxruntime refused it ({kind}) in {text}")
    return LibraryError("onnx", kind, text)


def session_of(model: Model, key: int, options: Callable[[], list[Any]] | None = None) -> Any:
    """The session of ``model`` for stream ``key``, made on first use (``options()`` gives its
    providers; default: the model's own)."""
    session = model.sessions.get(key)
    if session is None:
        ort = require("onnx")
        providers = model.providers if options is None else options()
        try:
            session = ort.InferenceSession(model.data, sess_options=model.options(ort),
                                           providers=providers)
        except Exception as exc:
            raise translate(exc, "loading the model") from exc
        model.sessions[key] = session
    return session


def _tensors(args: list[Any]) -> tuple[OnnxTensorInfo, ...]:
    return tuple(
        OnnxTensorInfo(a.name, _ELEMENT_TYPES.get(a.type, a.type),
                       tuple(d if isinstance(d, int) and d >= 0 else None for d in a.shape))
        for a in args)


def info_of(digest: str, session: Any) -> OnnxModelInfo:
    """The ``OnnxModelInfo`` of a session."""
    return OnnxModelInfo(digest, _tensors(session.get_inputs()), _tensors(session.get_outputs()),
                         tuple(session.get_providers()))


def load(backend: Any, op: LoadOnnxModel, providers: list[Any], key: int) -> OnnxModelInfo:
    """Keep the model under its digest (replacing one loaded before) with a session for stream
    ``key`` on ``providers``, and answer its info."""
    digest = op.digest
    model = Model(op.model, providers, op.threads, op.spinning)
    session = session_of(model, key)
    models(backend)[digest] = model
    return info_of(digest, session)


def model_of(backend: Any, digest: str) -> Model:
    """The model of ``digest`` in this context (``ModelNotLoaded`` if it has none)."""
    model = models(backend).get(digest)
    if model is None:
        raise ModelNotLoaded(f"onnx model {digest[:12]}... is not loaded in this context "
                             "(never loaded, unloaded, or the context was rebuilt since)")
    return model


@cpu.handles(RunOnnxModel)
def run(backend: Any, op: RunOnnxModel) -> dict[str, np.ndarray[Any, Any]]:
    """Run on the CPU provider: device tensors are views of the buffers' arrays; the outputs
    of ``into`` are copied into their buffers, those of ``fetch`` answered."""
    session = session_of(model_of(backend, op.digest), 0)

    def view(tensor: DeviceTensor) -> np.ndarray[Any, Any]:
        size = int(np.prod(tensor.shape))
        array: np.ndarray[Any, Any] = backend.array(tensor.ref.buffer_id)
        return array[:size].reshape(tensor.shape)

    feed = {name: view(v) if isinstance(v, DeviceTensor) else v for name, v in op.feeds}
    names = [*op.fetch, *(name for name, _ in op.into)]
    try:
        results = session.run(names, feed)
    except Exception as exc:
        raise translate(exc, "running the model") from exc
    answer = dict(zip(op.fetch, results[: len(op.fetch)], strict=True))
    for (name, tensor), result in zip(op.into, results[len(op.fetch):], strict=True):
        if tuple(result.shape) != tensor.shape:
            raise InvalidArgument(f"output {name!r} has shape {tuple(result.shape)}, not the "
                                  f"{tensor.shape} its buffer was given")
        view(tensor)[...] = result
    return answer


@shared.handles(UnloadOnnxModel)
def unload(backend: Any, op: UnloadOnnxModel) -> None:
    """Drop the model's sessions from this context."""
    models(backend).pop(op.digest, None)


@cpu.handles(LoadOnnxModel)
def _load_cpu(backend: Any, op: LoadOnnxModel) -> OnnxModelInfo:
    return load(backend, op, list(op.providers or (CPU_PROVIDER,)), 0)
