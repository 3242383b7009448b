"""The base of every op, and the checks ops use to validate themselves.

An op is a frozen, picklable dataclass naming its buffers by ``GpuRef``. The
same object is validated in the caller, checked against the context generation,
sent to a worker process, executed by a backend and written to a replay journal.

Ops are validated on every call, so the checks keep their success path cheap:
they test plain values first and build names and messages only on failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, TypeGuard

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields, reader_of
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = [
    "Op",
    "is_int",
    "positive_ints",
    "require",
    "require_dtype",
    "require_len",
    "require_nonneg",
    "require_numbers",
    "require_positive",
    "require_same_dtype",
    "matrix_extent",
]

_NUMBER_TYPES = (int, float, complex)
_BUFFER_READERS: dict[type, Callable[[object], tuple[object, ...]]] = {}


def _buffer_reader(cls: type) -> Callable[[object], tuple[object, ...]]:
    """Return (and remember) a function answering the values of ``cls``'s fields declared as
    buffers (``GpuRef``, optional or not), in field order."""
    names = [f.name for f in dataclasses.fields(cls) if "GpuRef" in str(f.type)]
    read = _BUFFER_READERS[cls] = reader_of(names)
    return read


class Op(PickleByFields):
    """Base class of ops; subclasses are ``@dataclass(frozen=True, slots=True)``.

    ``library`` names the kernel actor that runs the op (``"blas"``, ``"fft"``,
    ``"rng"``, ``"solver"``, ``"sparse"``, ``"tensor"``, or ``"memory"`` for the
    context itself). ``outputs`` names the fields the op writes. An op pickles
    as its class and field values (``PickleByFields``), so unpickling it does
    not validate it again.
    """

    __slots__ = ()
    library: ClassVar[str] = "memory"
    outputs: ClassVar[tuple[str, ...]] = ()

    def refs(self) -> tuple[GpuRef, ...]:
        """Every buffer the op touches: its fields declared as buffers, in field order."""
        read = _BUFFER_READERS.get(type(self)) or _buffer_reader(type(self))
        return tuple([v for v in read(self) if isinstance(v, GpuRef)])

    def handles(self) -> tuple[KernelRef | GraphRef, ...]:
        """Kernel and graph handles the op uses (generation-checked like buffers)."""
        return ()

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffers the op writes."""
        return tuple([
            v for name in self.outputs if isinstance(v := getattr(self, name), GpuRef)
        ])

    def validate(self) -> None:
        """Raise ``InvalidArgument`` if the op cannot run as given; runs in the caller."""


def require(condition: bool, message: str) -> None:
    """Raise ``InvalidArgument(message)`` unless ``condition`` holds."""
    if not condition:
        raise InvalidArgument(message)


def is_int(value: object) -> TypeGuard[int]:
    """Say whether ``value`` is an int and not a bool (an int subclass counts)."""
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def positive_ints(*values: object) -> bool:
    """Say whether every value is a plain ``int`` >= 1: a quick test before a detailed check.

    False is no refusal: an int subclass fails this test yet passes
    ``require_positive``, so run the detailed check when this answers False.
    """
    for v in values:  # noqa: SIM110 - a loop costs half of all() over a generator
        if type(v) is not int or v < 1:
            return False
    return True


def _require_ints(values: Mapping[str, object], least: int, what: str) -> None:
    """Raise for the first value that is not an int (bools excluded) >= ``least``."""
    for name, v in values.items():
        if not is_int(v) or v < least:
            raise InvalidArgument(f"{name} must be {what}, got {v!r}")


def require_nonneg(**values: int) -> None:
    """Every keyword value must be an int >= 0."""
    for v in values.values():
        if type(v) is not int or v < 0:  # not plainly fit: look at every value in detail
            _require_ints(values, 0, "a non-negative int")
            return


def require_positive(**values: int) -> None:
    """Every keyword value must be an int >= 1."""
    for v in values.values():
        if type(v) is not int or v < 1:  # not plainly fit: look at every value in detail
            _require_ints(values, 1, "a positive int")
            return


def require_numbers(dtype: DType, **values: object) -> None:
    """Every keyword value must be a number (not a bool), and real unless ``dtype`` is complex."""
    for name, v in values.items():
        if type(v) is float:  # a number, and real
            continue
        if not isinstance(v, _NUMBER_TYPES) or isinstance(v, bool):
            raise InvalidArgument(f"{name} must be a number, got {v!r}")
        if not (dtype.is_complex or complex(v).imag == 0):
            raise InvalidArgument(f"{name} is complex ({v!r}) but the data are {dtype.value}")


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
    if ld < (rows if rows > 1 else 1):  # max(1, rows), without a builtin call's cost
        raise InvalidArgument(f"leading dimension of {name} is {ld}; it must be >= {max(1, rows)}")
    return 0 if rows == 0 or cols == 0 else ld * (cols - 1) + rows
