"""The fp8 GEMM of the ``cutlass`` library (``Cutlass.gemm_fp8``).

``CutlassGemmFp8``: ``D = epilogue(scale_a * scale_b * A @ B)`` with fp8
operands (``e4m3`` = ``float8_e4m3fn`` or ``e5m2``, each operand its own
format) held as bits in ``u8`` buffers (``atomr_accel.cutlass.to_fp8`` makes
them), f32 accumulation, and ``D`` stored in bf16, f16 or f32.

Layout ("TN", what Hopper's fp8 tensor cores read: both operands K-major):
``a`` is ``m x k`` row-major and ``b`` is ``n x k`` row-major, i.e. ``B``
transposed; ``d`` is ``m x n`` row-major. ``m``, ``n`` and ``k`` must be
multiples of 16 (16-byte TMA rows of fp8 and of the output tile's stores, the
rule cuBLASLt's and ``torch._scaled_mm``'s fp8 GEMMs have too).

The epilogue is the ``Epilogue`` of ``CutlassGemm``, every node included:
``scale`` multiplies on top of ``scale_a * scale_b``, ``bias`` and
``residual_add`` take D's dtype, one activation, then ``reduce``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from atomr_accel.core._api import Form
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.core._op import Op, require, require_dtype, require_len, require_positive
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._cutlass import _EPILOGUE, _EpilogueGemm
from atomr_accel.core.ops._cutlass_plan import FP8_FORMATS, FP8_OUT_DTYPES

__all__ = ["FP8_ALIGNMENT", "CutlassGemmFp8"]

FP8_ALIGNMENT = 16
"""What an fp8 GEMM's ``m``, ``n`` and ``k`` must be multiples of."""


def _number(value: object, name: str) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True, slots=True)
class CutlassGemmFp8(_EpilogueGemm, Op):
    """``D = epilogue(scale_a * scale_b * A @ B)`` in fp8: ``a`` (``m x k``, row-major) and
    ``b`` (``n x k``, row-major: B transposed, "TN") are ``u8`` buffers of fp8 bits in
    ``a_format`` / ``b_format`` (``e4m3`` or ``e5m2``; ``atomr_accel.cutlass.to_fp8``);
    ``d`` (``m x n``) is bf16, f16 or f32; f32 accumulation; ``m``, ``n``, ``k`` multiples
    of 16. ``epilogue``: an ``Epilogue`` (None: store the scaled product), its buffers of
    D's dtype. ``fast_accum``: keep the whole sum in the tensor cores' fp8 accumulator
    (faster, less accurate; default: promote it to f32 every few k-blocks, as
    ``torch._scaled_mm`` does). ``d`` must not be an input."""

    api = (Form("gemm_fp8", ("a", "b", "d", "m", "n", "k", _EPILOGUE)),)
    a_format: str = "e4m3"
    b_format: str = "e4m3"
    scale_a: float = 1.0
    scale_b: float = 1.0
    fast_accum: bool = False

    @property
    def alpha(self) -> float:
        """The one scale the kernel applies: ``scale_a * scale_b`` times the epilogue's."""
        return float(self.scale_a) * float(self.scale_b) * self.epilogue.alpha

    def validate(self) -> None:
        require_positive(m=self.m, n=self.n, k=self.k)
        for name in ("a_format", "b_format"):
            value = getattr(self, name)
            require(isinstance(value, str) and value in FP8_FORMATS,
                    f"{name} must be 'e4m3' or 'e5m2', got {value!r}")
        require(isinstance(self.fast_accum, bool),
                f"fast_accum must be a bool, got {self.fast_accum!r}")
        _number(self.scale_a, "scale_a")
        _number(self.scale_b, "scale_b")
        for name, ref in (("a", self.a), ("b", self.b)):
            if not isinstance(ref, GpuRef):
                raise InvalidArgument(f"{name} must be a buffer, got {type(ref).__name__}")
            if ref.dtype is not DType.U8:
                raise DTypeMismatch(f"{name} holds fp8 bits and must be u8, got "
                                    f"{ref.dtype.value} (encode with cutlass.to_fp8)")
        if not isinstance(self.d, GpuRef):
            raise InvalidArgument(f"d must be a buffer, got {type(self.d).__name__}")
        if self.d.dtype not in FP8_OUT_DTYPES:
            names = ", ".join(d.value for d in FP8_OUT_DTYPES)
            raise DTypeMismatch(f"d must be {names}, got {self.d.dtype.value}")
        for name, value in (("m", self.m), ("n", self.n), ("k", self.k)):
            require(value % FP8_ALIGNMENT == 0,
                    f"{name} ({value}) must be a multiple of {FP8_ALIGNMENT} for an fp8 GEMM "
                    "(16-byte rows of fp8)")
        require_len(self.a, self.m * self.k, "a")
        require_len(self.b, self.n * self.k, "b")
        require_len(self.d, self.m * self.n, "d")
        require_dtype(self.d, FP8_OUT_DTYPES, "d")
        self._check_epilogue(self.d.dtype)
