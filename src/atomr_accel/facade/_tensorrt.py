"""``TensorRt`` and ``TrtEngine`` in the original package's names, without engines.

The ``tensorrt`` package cannot be installed where this package is built and
tested, so it runs no TensorRT code: ``TensorRt.is_available()`` and
``runtime_ready()`` are False, and every other call raises
``LibraryUnavailable`` naming ``tensorrt`` (the import's own error), or, where
``tensorrt`` does import, ``LibraryError("tensorrt", "unsupported")``: this
build has no TensorRT engine paths, since none could be tested. Both are
``GpuRuntimeError``s whose message names ``tensorrt``, as the original's did.
Run ONNX models with ``dev.onnx()`` instead (``OnnxEngine``).
"""

from __future__ import annotations

from typing import Any, NoReturn

from atomr_accel.backends._optional import unavailable
from atomr_accel.core._errors import LibraryError

__all__ = ["TensorRt", "TrtEngine"]


def _refuse() -> NoReturn:
    """Raise why TensorRT cannot run here."""
    error = unavailable("tensorrt")
    if error is not None:
        raise error
    raise LibraryError("tensorrt", "unsupported",
                       "tensorrt imports, but this build of atomr-accel has no TensorRT engine "
                       "paths; run the ONNX model with dev.onnx() instead")


class TrtEngine:
    """A deserialized TensorRT engine, in the original's names. None can be made here (see the
    module docstring): constructing one and each method raise ``LibraryUnavailable``."""

    def __init__(self, path: str) -> None:
        _refuse()

    def is_loaded(self) -> bool:
        """Whether the engine is deserialized (raises here)."""
        _refuse()

    @property
    def num_io_tensors(self) -> int:
        """The engine's input and output tensor count (raises here)."""
        _refuse()

    def binding_info(self) -> list[Any]:
        """The engine's tensors: name, shape, dtype, direction (raises here)."""
        _refuse()

    def execute(self, device: Any, inputs: Any, outputs: Any, input_shapes: Any = None,
                ts: float = 60.0) -> None:
        """Run the engine on a device's buffers (raises here)."""
        _refuse()

    def __repr__(self) -> str:
        return "TrtEngine(unavailable)"


class TensorRt:
    """TensorRT in the original's names: ``runtime_ready()``, ``load_engine(path)``,
    ``build_engine_from_onnx(...)``; unavailable here (see the module docstring)."""

    @staticmethod
    def is_available() -> bool:
        """False: this build runs no TensorRT engines."""
        return False

    @staticmethod
    def runtime_ready() -> bool:
        """False: no TensorRT runtime can be created here."""
        return False

    @staticmethod
    def unavailable_reason() -> str:
        """Why TensorRT cannot run here: the message of the error every call raises."""
        try:
            _refuse()
        except LibraryError as exc:
            return str(exc)

    @staticmethod
    def load_engine(path: str) -> TrtEngine:
        """Deserialize a TensorRT engine file (raises ``LibraryUnavailable`` here)."""
        _refuse()

    @staticmethod
    def build_engine_from_onnx(onnx_path: str, output_path: str, fp16: bool = False,
                               int8: bool = False, workspace_bytes: int = 1 << 30,
                               ts: float = 600.0) -> str:
        """Build an engine from an ONNX file and write it to ``output_path`` (raises
        ``LibraryUnavailable`` here)."""
        _refuse()

    def __repr__(self) -> str:
        return "TensorRt(unavailable)"
