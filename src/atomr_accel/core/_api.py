"""How the facade offers an op: ``Form`` and ``Param``, declared once on the op class.

An op class lists its facade methods in ``api``. Each ``Form`` names a method
of a handle (``Blas``, ``Solver``, the ``Device`` itself, ...) and its
positional parameters; the op's other fields become keyword-only options with
the field's default. From each form the facade generates ``name_async`` (it
checks its arguments when called and returns the awaitable of the op), its
blocking twin ``name`` and, for ``dtypes``, one variant per dtype
(``name_f32``, ...) that refuses buffers of another dtype. Every method takes
``timeout_secs``. A ``Param`` declares a parameter that is not simply the field
of its name: another default, a parser of option strings (the original
package's ``trans="N"``: ``atomr_accel.original``), or a value filled in when
omitted (``n=None``: the whole buffer).

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
    "REQUIRED",
    "Form",
    "Param",
    "attach",
    "choice",
    "on_attach",
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


# ------------------------------------------------------------------ option strings


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
