"""Tensor contractions (cuTENSOR or ``cupy.einsum`` on CUDA, ``numpy.einsum`` on CPU).

Tensors are dense and row-major (C-order); each axis carries a one-letter mode
label, as in cuTENSOR's contraction and Einstein notation.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import (
    Op,
    positive_sizes,
    require_len,
    require_numbers,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef

__all__ = ["Contract"]

declare("tensor", "Tensor",
        "cuTENSOR-shaped contractions.",
        rank=6, handle="Tensor", capturable=True)

_DTYPES = (DType.F32, DType.F64, DType.C64, DType.C128)
_LETTERS = frozenset(string.ascii_letters)


def _check_operand(name: str, modes: str, shape: tuple[int, ...]) -> None:
    """Check that labels are distinct ASCII letters with one positive extent each in ``shape``."""
    if not isinstance(modes, str):
        raise InvalidArgument(f"{name}_modes must be a str, got {modes!r}")
    if not _LETTERS.issuperset(modes):
        raise InvalidArgument(f"{name}_modes must be ASCII letters, got {modes!r}")
    if len(set(modes)) != len(modes):
        raise InvalidArgument(f"{name}_modes repeats a label: {modes!r}")
    if not isinstance(shape, tuple):
        raise InvalidArgument(f"{name}_shape must be a tuple, got {shape!r}")
    if len(shape) != len(modes):
        raise InvalidArgument(
            f"{name}_shape {shape} has {len(shape)} extents for {len(modes)} modes {modes!r}"
        )
    if not positive_sizes(shape):
        raise InvalidArgument(f"{name}_shape extents must be positive ints, got {shape!r}")


@dataclass(frozen=True, slots=True)
class Contract(Op):
    """Compute ``C = alpha * contract(A, B) + beta * C`` over mode labels, like ``einsum``.

    ``a_modes``, ``b_modes`` and ``c_modes`` label the axes of row-major
    tensors of ``a_shape``, ``b_shape`` and ``c_shape`` (``"abc,cd->abd"`` is
    ``Contract(a, "abc", ..., b, "cd", ..., c, "abd", ...)``). Labels missing
    from ``c_modes`` are summed over. All tensors share one dtype
    (f32/f64/c64/c128); when ``beta == 0``, ``C`` is only written. ``C`` may not
    share a buffer with ``A`` or ``B``. The handler answers the name of the
    implementation that ran: ``"numpy.einsum"`` on CPU, ``"cutensor"`` or
    ``"cupy.einsum"`` on CUDA.
    """

    library: ClassVar[str] = "tensor"
    outputs: ClassVar[tuple[str, ...]] = ("c",)
    api = (Form("contract", ("a", "a_modes", "a_shape", "b", "b_modes", "b_shape", "c",
                         "c_modes", "c_shape"), returns="str"),)
    a: GpuRef
    a_modes: str
    a_shape: tuple[int, ...]
    b: GpuRef
    b_modes: str
    b_shape: tuple[int, ...]
    c: GpuRef
    c_modes: str
    c_shape: tuple[int, ...]
    alpha: complex = 1.0
    beta: complex = 0.0

    @property
    def subscripts(self) -> str:
        """The contraction in ``einsum`` notation (``"abc,cd->abd"``)."""
        return f"{self.a_modes},{self.b_modes}->{self.c_modes}"

    def validate(self) -> None:
        _check_operand("a", self.a_modes, self.a_shape)
        _check_operand("b", self.b_modes, self.b_shape)
        _check_operand("c", self.c_modes, self.c_shape)
        extents: dict[str, int] = {}
        for name, modes, shape in (
            ("a", self.a_modes, self.a_shape),
            ("b", self.b_modes, self.b_shape),
            ("c", self.c_modes, self.c_shape),
        ):
            for mode, extent in zip(modes, shape, strict=True):
                seen = extents.setdefault(mode, extent)
                if seen != extent:
                    raise InvalidArgument(
                        f"mode {mode!r} has extent {extent} in {name} but {seen} elsewhere"
                    )
        missing = set(self.c_modes) - set(self.a_modes) - set(self.b_modes)
        if missing:
            raise InvalidArgument(f"output modes {sorted(missing)} appear in neither input")
        dtype = require_shared_dtype(_DTYPES, a=self.a, b=self.b, c=self.c)
        require_numbers(dtype, alpha=self.alpha, beta=self.beta)
        require_len(self.a, math.prod(self.a_shape), "a")
        require_len(self.b, math.prod(self.b_shape), "b")
        require_len(self.c, math.prod(self.c_shape), "c")
        key = (self.c.device_id, self.c.buffer_id)
        if key in {(r.device_id, r.buffer_id) for r in (self.a, self.b)}:
            raise InvalidArgument("c must not share a buffer with a or b")
