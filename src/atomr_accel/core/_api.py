"""How the facade offers an op: ``Form`` and ``Param``, declared once on the op class.

An op class lists its facade methods in ``api``. Each ``Form`` names a method
of a handle (``Blas``, ``Solver``, the ``Device`` itself, ...) and its
positional parameters; the op's other fields become keyword-only options with
the field's default. From each form the facade generates ``name_async`` (it
checks its arguments when called and returns the awaitable of the op), its
blocking twin ``name`` and, for ``dtypes``, one variant per dtype
(``name_f32``, ...) that refuses buffers of another dtype. Every method takes
``timeout_secs``. A ``Param`` declares a parameter that is not simply the field
of its name: another default, a parser from the original package's option
strings (``trans="N"``), or a value filled in when omitted (``n=None``: the
whole buffer).

The original package's forms of an op are not written in its declaration:
``atomr_accel.original`` attaches them to the op class (``attach``), and a
method set made before that receives them then (``on_attach``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument

__all__ = [
    "REALS",
    "REQUIRED",
    "Form",
    "Param",
    "attach",
    "choice",
    "diag_flag",
    "on_attach",
    "original",
    "side_flag",
    "trans_flag",
    "trans_flags",
    "trans_param",
    "uplo_flag",
    "uplo_param",
    "vector_count",
    "whole_vectors",
]


class _Required:
    """The default of a parameter that has none."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Marks a ``Param`` the caller must pass."""


@dataclasses.dataclass(frozen=True, slots=True)
class Param:
    """A facade parameter that is not simply the op field of the same name.

    ``to`` names the fields it sets (default: the field ``name``); ``parse``
    turns the caller's value into the field's value (a tuple of values when
    ``to`` names several). ``fill``, called with the values of the fields named
    in ``uses``, supplies the value when the caller passes None. ``annotation``
    is the parameter's type as the signature shows it.
    """

    name: str
    default: Any = REQUIRED
    to: tuple[str, ...] = ()
    parse: Callable[[Any], Any] | None = None
    fill: Callable[..., Any] | None = None
    uses: tuple[str, ...] = ()
    annotation: str | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        """The op fields this parameter sets."""
        return self.to or (self.name,)


@dataclasses.dataclass(frozen=True, slots=True)
class Form:
    """One facade method of an op: ``name`` on the handle ``handle`` (default: the op's
    library), positional ``params`` in order (field names or ``Param``), one variant per
    dtype in ``dtypes``, the default ``timeout`` in seconds (None: the system's
    ``op_timeout``), the result's type as the signature shows it, and ``fixed`` field
    values the form sets itself. ``doc`` (default: the op's docstring) and ``note`` (added
    to it) document the method."""

    name: str
    params: tuple[str | Param, ...]
    handle: str | None = None
    dtypes: tuple[DType, ...] = ()
    timeout: float | None = None
    returns: str = "None"
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    doc: str | None = None
    note: str = ""
    suffixed: bool = True
    """False: the one variant of ``dtypes`` keeps ``name`` (``sgemm``)."""
    timeout_last: bool = False
    """True: ``timeout_secs`` follows ``params`` as the last positional parameter (the
    original package's methods); else it is keyword-only."""


_LISTENERS: list[Callable[[type, tuple[Form, ...]], None]] = []


def attach(op: type, *forms: Form) -> None:
    """Add ``forms`` to the facade methods of the op class ``op`` (after those it declares),
    and tell each ``on_attach`` listener."""
    op.api = (*op.api, *forms)  # type: ignore[attr-defined]
    for listener in _LISTENERS:
        listener(op, forms)


def on_attach(listener: Callable[[type, tuple[Form, ...]], None]) -> None:
    """Call ``listener(op, forms)`` on every later ``attach``."""
    _LISTENERS.append(listener)


# ------------------------------------------------- the original package's option strings


def choice(name: str, values: Mapping[str | bool, Any]) -> Callable[[Any], Any]:
    """A parser taking one of ``values``' keys: a str, case-insensitive, or a bool where
    ``values`` has bool keys; anything else is an ``InvalidArgument`` naming the choices."""

    def parse(value: Any) -> Any:
        if isinstance(value, str):
            value = value.lower()
        if isinstance(value, str | bool) and value in values:
            return values[value]
        choices = ", ".join(repr(k) for k in values if isinstance(k, str))
        raise InvalidArgument(f"{name} must be one of {choices}, got {value!r}")

    parse.__name__ = f"parse_{name}"
    return parse


trans_flags = choice("trans", {"n": (False, False), "t": (True, False), "c": (True, True),
                               False: (False, False), True: (True, False)})
"""``"N"``/``"T"``/``"C"`` (or a bool) as ``(trans, conj)``."""

trans_flag = choice("trans", {"n": False, "t": True, False: False, True: True})
"""``"N"``/``"T"`` (or a bool) as ``trans``, for ops with no conjugate."""

uplo_flag = choice("uplo", {"u": True, "upper": True, "l": False, "lower": False})
"""``"U"``/``"L"`` as ``upper``."""

side_flag = choice("side", {"l": True, "left": True, "r": False, "right": False})
"""``"L"``/``"R"`` as ``left``."""

diag_flag = choice("diag", {"n": False, "u": True})
"""``"N"``/``"U"`` as ``unit_diag``."""


def vector_count(*vectors: Any) -> int:
    """The ``n`` that covers every vector: pairs ``(ref, inc)`` flattened as
    ``ref1, inc1, ref2, inc2``; a vector of ``L`` elements ``|inc|`` apart holds
    ``(L - 1) // |inc| + 1`` of them."""
    counts = []
    for ref, inc in zip(vectors[::2], vectors[1::2], strict=True):
        step = abs(inc) if isinstance(inc, int) and inc != 0 else 1
        counts.append(0 if ref.length == 0 else (ref.length - 1) // step + 1)
    return min(counts)


REALS = (DType.F32, DType.F64)
"""The dtypes of the original package's ``_f32`` / ``_f64`` methods."""


def original(name: str, params: tuple[str | Param, ...], timeout: float,
             returns: str = "None", dtypes: tuple[DType, ...] = REALS) -> Form:
    """The original package's ``name_f32`` / ``name_f64`` form of an op."""
    return Form(name, params, dtypes=dtypes, timeout=timeout, returns=returns,
                note="The original package's form.", timeout_last=True)


def whole_vectors(*vectors: str) -> Param:
    """The original's ``n=None``: as many elements as every vector holds."""
    uses = tuple(name for v in vectors for name in (v, f"inc{v}"))
    return Param("n", None, fill=vector_count, uses=uses, annotation="int | None")


def trans_param(name: str, conj: str) -> Param:
    """The original's ``"N"``/``"T"``/``"C"`` option as an op's transpose and conjugate."""
    return Param(name, "N", to=(name, conj), parse=trans_flags, annotation="str | bool")


def uplo_param(default: str) -> Param:
    """The original's ``uplo="U"``/``"L"`` as an op's ``upper``."""
    return Param("uplo", default, to=("upper",), parse=uplo_flag, annotation="str")
