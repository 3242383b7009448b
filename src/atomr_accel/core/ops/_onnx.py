"""Ops of ONNX models (the ``onnx`` library): load a model into a session of the context, run
it on buffers or host arrays, and drop it.

A session lives in its context, under the SHA-256 digest of the model's bytes
(``model_digest``); a run names the model by that digest, so the bytes travel
once, with ``LoadOnnxModel``. A context rebuilt since the load has no session:
a run there raises ``ModelNotLoaded``, and the engine loads the model again.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from atomr_accel.core._catalogue import declare
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import Op, is_int, require, require_nonneg
from atomr_accel.core._ref import GpuRef

__all__ = [
    "DeviceTensor",
    "LoadOnnxModel",
    "ModelNotLoaded",
    "OnnxModelInfo",
    "OnnxTensorInfo",
    "RunOnnxModel",
    "UnloadOnnxModel",
    "model_digest",
]

declare("onnx", "Onnx",
        "ONNX models on ONNX Runtime: sessions of the context, run on the library's stream.",
        rank=15, handle="Onnx")


class ModelNotLoaded(InvalidArgument):
    """A run named a model this context holds no session of (never loaded here, unloaded, or
    the context was rebuilt since): load it again."""


def model_digest(model: bytes) -> str:
    """The SHA-256 hex digest that names a model's session in a context."""
    return hashlib.sha256(model).hexdigest()


@dataclass(frozen=True, slots=True)
class OnnxTensorInfo(PickleByFields):
    """One input or output of a model: its name, NumPy dtype name (``"float32"``) and shape
    (None for a dimension the model leaves open, such as the batch)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True, slots=True)
class OnnxModelInfo(PickleByFields):
    """What loading a model answers: its digest, inputs, outputs and the execution providers
    its session runs on."""

    digest: str
    inputs: tuple[OnnxTensorInfo, ...]
    outputs: tuple[OnnxTensorInfo, ...]
    providers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeviceTensor(PickleByFields):
    """A buffer seen as a C-order tensor of ``shape``: its first ``prod(shape)`` elements."""

    ref: GpuRef
    shape: tuple[int, ...]

    def validate(self) -> None:
        """Raise ``InvalidArgument`` unless ``shape`` is non-negative ints that fit the buffer."""
        require(isinstance(self.ref, GpuRef),
                f"a device tensor needs a buffer, got {type(self.ref).__name__}")
        require(isinstance(self.shape, tuple) and all(is_int(d) and d >= 0 for d in self.shape),
                f"shape must be a tuple of non-negative ints, got {self.shape!r}")
        size = math.prod(self.shape)
        require(size <= self.ref.length,
                f"shape {self.shape} needs {size} elements but the buffer holds "
                f"{self.ref.length}")


def _names(names: tuple[Any, ...], what: str) -> None:
    require(isinstance(names, tuple) and all(isinstance(n, str) and n for n in names),
            f"{what} must be a tuple of non-empty names, got {names!r}")
    require(len(set(names)) == len(names), f"{what} name a tensor twice: {names!r}")


@dataclass(frozen=True, slots=True)
class LoadOnnxModel(Op):
    """Make (or replace) the session of the serialized ONNX ``model`` in the context and answer
    its ``OnnxModelInfo``. ``providers`` are ONNX Runtime execution provider names (None: the
    CUDA provider on a CUDA device, the CPU provider on the CPU backend). ``threads`` is the
    CPU provider's intra-op thread count (0: ONNX Runtime's default); ``spinning`` lets its
    idle threads spin (off by default: spinning threads take the cores that the event loop
    and the other requests need)."""

    library: ClassVar[str] = "onnx"
    model: bytes
    providers: tuple[str, ...] | None = None
    threads: int = 0
    spinning: bool = False

    def validate(self) -> None:
        require(isinstance(self.model, bytes) and len(self.model) > 0,
                "model must be the non-empty bytes of a serialized ONNX model")
        require_nonneg(threads=self.threads)
        if self.providers is not None:
            _names(self.providers, "providers")

    @property
    def digest(self) -> str:
        """The model's digest (``model_digest``)."""
        return model_digest(self.model)


@dataclass(frozen=True, slots=True)
class RunOnnxModel(Op):
    """Run the model of ``digest`` once: answer the outputs named in ``fetch`` as host arrays
    (a dict by name) and write those of ``into`` into their buffers.

    ``feeds`` pairs each input's name with a host array or a ``DeviceTensor``.
    On CUDA, device tensors are bound to the session by pointer on the op's
    stream (no copy through the host). Raises ``ModelNotLoaded`` when the
    context holds no session of ``digest``.
    """

    library: ClassVar[str] = "onnx"
    digest: str
    feeds: tuple[tuple[str, Any], ...]
    fetch: tuple[str, ...] = ()
    into: tuple[tuple[str, DeviceTensor], ...] = ()

    def refs(self) -> tuple[GpuRef, ...]:
        """The buffers of the device-tensor inputs, then of the outputs."""
        fed = [v.ref for _, v in self.feeds if isinstance(v, DeviceTensor)]
        return (*fed, *(t.ref for _, t in self.into))

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffers of the outputs written on the device."""
        return tuple(t.ref for _, t in self.into)

    def validate(self) -> None:
        require(isinstance(self.digest, str) and len(self.digest) == 64,
                f"digest must be a model's SHA-256 hex digest, got {self.digest!r}")
        require(isinstance(self.feeds, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 for p in self.feeds),
            "feeds must be a tuple of (input name, array or DeviceTensor) pairs")
        _names(tuple(name for name, _ in self.feeds), "feeds")
        for name, value in self.feeds:
            if isinstance(value, DeviceTensor):
                value.validate()
            else:
                require(isinstance(value, np.ndarray),
                        f"input {name!r} must be a NumPy array or a DeviceTensor, "
                        f"got {type(value).__name__}")
        require(isinstance(self.into, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], DeviceTensor)
            for p in self.into), "into must be a tuple of (output name, DeviceTensor) pairs")
        written = tuple(name for name, _ in self.into)
        _names(self.fetch, "fetch")
        _names(written, "into")
        both = set(self.fetch) & set(written)
        require(not both, f"outputs {sorted(both)} are asked both to the host and into buffers")
        require(bool(self.fetch or written), "a run must ask for at least one output")
        for _, tensor in self.into:
            tensor.validate()


@dataclass(frozen=True, slots=True)
class UnloadOnnxModel(Op):
    """Drop the session of the model of ``digest`` from the context (nothing if it has none)."""

    library: ClassVar[str] = "onnx"
    digest: str

    def validate(self) -> None:
        require(isinstance(self.digest, str) and len(self.digest) == 64,
                f"digest must be a model's SHA-256 hex digest, got {self.digest!r}")
