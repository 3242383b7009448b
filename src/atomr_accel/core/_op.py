"""The base of every op, and the checks ops use to validate themselves.

An op is a frozen, picklable dataclass naming its buffers by ``GpuRef``. The
same object is validated in the caller, checked against the context generation,
sent to a worker process, executed by a backend and written to a replay journal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = [
    "Op",
    "require",
    "require_dtype",
    "require_len",
    "require_nonneg",
    "require_positive",
    "require_same_dtype",
    "matrix_extent",
]


class Op:
    """Base class of ops; subclasses are ``@dataclass(frozen=True, slots=True)``.

    ``library`` names the kernel actor that runs the op (``"blas"``, ``"fft"``,
    ``"rng"``, ``"solver"``, ``"sparse"``, ``"tensor"``, or ``"memory"`` for the
    context itself). ``outputs`` names the fields the op writes.
    """

    __slots__ = ()
    library: ClassVar[str] = "memory"
    outputs: ClassVar[tuple[str, ...]] = ()

    def refs(self) -> tuple[GpuRef, ...]:
        """Every buffer the op touches, in field order."""
        return tuple(
            v for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if isinstance(v := getattr(self, f.name), GpuRef)
        )

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """Kernel and graph handles the op uses (generation-checked like buffers)."""
        return ()

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffers the op writes."""
        return tuple(
            v for name in self.outputs if isinstance(v := getattr(self, name), GpuRef)
        )

    def validate(self) -> None:
        """Raise ``InvalidArgument`` if the op cannot run as given; runs in the caller."""


def require(condition: bool, message: str) -> None:
    """Raise ``InvalidArgument(message)`` unless ``condition`` holds."""
    if not condition:
        raise InvalidArgument(message)


def require_nonneg(**values: int) -> None:
    """Every keyword value must be an int >= 0."""
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise InvalidArgument(f"{name} must be a non-negative int, got {v!r}")


def require_positive(**values: int) -> None:
    """Every keyword value must be an int >= 1."""
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InvalidArgument(f"{name} must be a positive int, got {v!r}")


def require_dtype(ref: GpuRef, allowed: Iterable[DType], name: str) -> None:
    """``ref`` must hold one of ``allowed``."""
    allowed = tuple(allowed)
    if ref.dtype not in allowed:
        names = ", ".join(d.value for d in allowed)
        raise InvalidArgument(f"{name} has dtype {ref.dtype.value}; expected one of {names}")


def require_same_dtype(**refs: GpuRef) -> DType:
    """All refs share one dtype; return it."""
    items = list(refs.items())
    first_name, first = items[0]
    for name, ref in items[1:]:
        if ref.dtype is not first.dtype:
            raise InvalidArgument(
                f"{name} has dtype {ref.dtype.value} but {first_name} has {first.dtype.value}"
            )
    return first.dtype


def require_len(ref: GpuRef, needed: int, name: str) -> None:
    """``ref`` must hold at least ``needed`` elements."""
    if needed > ref.length:
        raise InvalidArgument(
            f"{name} needs {needed} elements but its buffer holds {ref.length}"
        )


def matrix_extent(rows: int, cols: int, ld: int, name: str) -> int:
    """Elements a column-major ``rows`` x ``cols`` matrix with leading dimension ``ld`` spans.

    Checks ``ld >= max(1, rows)`` as BLAS does.
    """
    if ld < max(1, rows):
        raise InvalidArgument(f"leading dimension of {name} is {ld}; it must be >= {max(1, rows)}")
    return 0 if rows == 0 or cols == 0 else ld * (cols - 1) + rows

