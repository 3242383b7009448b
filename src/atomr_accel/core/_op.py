"""The base of every op, and the checks ops use to validate themselves.

An op is a frozen, picklable dataclass naming its buffers by ``GpuRef``. The
same object is validated in the caller, checked against the context generation,
sent to a worker process, executed by a backend and written to a replay journal.

Ops are validated on every call, so the checks keep their success path cheap:
they test plain values first and build names and messages only on failure.

``checked`` is how the device takes an op: it checks every field against the
type its class declares, once for all ops (a ``bool`` option must be a bool,
an enum option one of its choices, a ``str`` a str), makes integer-likes such
as NumPy integers plain ``int`` (sizes, offsets, lengths and counts accept
anything with ``__index__`` but bools) and NumPy numbers given for a ``float``
field plain ``float``, then runs the op's own ``validate``.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, TypeGuard, TypeVar, cast

from atomr_accel.core._api import Form
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument, interrupt_in
from atomr_accel.core._fields import PickleByFields, reader_of
from atomr_accel.core._hit_rate import HitRate
from atomr_accel.core._ref import GpuRef, GraphRef, KernelRef

__all__ = [
    "Op",
    "checked",
    "is_int",
    "kept",
    "made",
    "positive_ints",
    "positive_sizes",
    "remembered",
    "require",
    "require_buffer",
    "require_dtype",
    "require_len",
    "require_nonneg",
    "require_numbers",
    "require_positive",
    "require_same_dtype",
    "require_shared_dtype",
    "matrix_extent",
    "validated",
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

    ``library`` names the kernel actor that runs the op (a catalogued library:
    ``"blas"``, ``"fft"``, ..., or ``"memory"`` for the context itself).
    ``outputs`` names the fields the op writes. An op pickles as its class and
    field values (``PickleByFields``), so unpickling it does not validate it
    again. The traits below say how the op runs; each op class sets its own.
    """

    __slots__ = ()
    library: ClassVar[str] = "memory"
    outputs: ClassVar[tuple[str, ...]] = ()
    queues_only: ClassVar[bool] = False
    """Its GPU handler only queues device work (no host sync, no compile), so an event loop
    may launch it itself."""
    host_result: ClassVar[bool] = False
    """It answers a value computed on the host from device data (a dot product), so a graph
    cannot record it."""
    capturable: ClassVar[bool] = False
    """A graph may record it though its library's ops may not be (a copy, a kernel launch);
    a capturable library's ops may be recorded unless they answer a host value."""
    replayable: ClassVar[bool] = False
    """Run again with equal fields, its handler queues the same device work on the same
    memory (it keeps no device memory it may later replace), so a graph recorded from a
    later run may stand in for it (a repeated ``OpSequence`` on CUDA); a graph may record it
    unless it answers a host value."""
    in_process: ClassVar[bool] = False
    """It holds live objects of the caller's process (an array, a torch event): its facade
    methods refuse a context elsewhere, and a device with a journal refuses it if it writes."""
    api: ClassVar[tuple[Form, ...]] = ()
    """The facade methods that run the op (``core._api.Form``), declared once here."""

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
    """Say whether ``value`` is an integer: an int, or anything with ``__index__`` (NumPy
    integers), but not a bool."""
    if type(value) is int:
        return True
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return False
    return True


def positive_ints(*values: object) -> bool:
    """Say whether every value is a plain ``int`` >= 1: a quick test before a detailed check.

    False is no refusal: an int subclass or a NumPy integer fails this test yet
    passes ``require_positive``, so run the detailed check when this answers False.
    """
    for v in values:  # noqa: SIM110 - a loop costs half of all() over a generator
        if type(v) is not int or v < 1:
            return False
    return True


def positive_sizes(values: tuple[object, ...]) -> bool:
    """Say whether every value is an integer (``is_int``) >= 1: ``positive_ints``' quick
    test, then the detailed one where that fails (a refusal, unlike its False)."""
    for v in values:
        if type(v) is not int or v < 1:  # not plainly fit: look at every value in detail
            return all(is_int(w) and w >= 1 for w in values)
    return True


def _require_ints(values: Mapping[str, object], least: int, what: str) -> None:
    """Raise for the first value that is not an integer (``is_int``) >= ``least``."""
    for v in values.values():
        if type(v) is not int or v < least:  # not plainly fit: look at every value in detail
            for name, w in values.items():
                if not is_int(w) or w < least:
                    raise InvalidArgument(f"{name} must be {what}, got {w!r}")
            return


def require_nonneg(**values: int) -> None:
    """Every keyword value must be an int >= 0."""
    _require_ints(values, 0, "a non-negative int")


def require_positive(**values: int) -> None:
    """Every keyword value must be an int >= 1."""
    _require_ints(values, 1, "a positive int")


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


def require_shared_dtype(allowed: tuple[DType, ...], **refs: GpuRef) -> DType:
    """The first of ``refs`` holds one of ``allowed`` and every other one its dtype; return it."""
    dtype = next(iter(refs.values())).dtype
    if dtype in allowed:
        for ref in refs.values():
            if ref.dtype is not dtype:
                break
        else:
            return dtype
    first = next(iter(refs))  # not plainly fit: check in order, naming the culprit
    require_dtype(refs[first], allowed, first)
    return require_same_dtype(**refs)


def require_len(ref: GpuRef, needed: int, name: str) -> None:
    """``ref`` must hold at least ``needed`` elements."""
    if needed > ref.length:
        raise InvalidArgument(
            f"{name} needs {needed} elements but its buffer holds {ref.length}"
        )


def require_buffer(ref: GpuRef, dtypes: tuple[DType, ...], needed: int, name: str) -> None:
    """``ref`` must hold one of ``dtypes`` and at least ``needed`` elements."""
    if ref.dtype not in dtypes or needed > ref.length:  # not plainly fit: check in order
        require_dtype(ref, dtypes, name)
        require_len(ref, needed, name)


def matrix_extent(rows: int, cols: int, ld: int, name: str) -> int:
    """Elements a column-major ``rows`` x ``cols`` matrix with leading dimension ``ld`` spans.

    Checks ``ld >= max(1, rows)`` as BLAS does.
    """
    if ld < (rows if rows > 1 else 1):  # max(1, rows), without a builtin call's cost
        raise InvalidArgument(f"leading dimension of {name} is {ld}; it must be >= {max(1, rows)}")
    return 0 if rows == 0 or cols == 0 else ld * (cols - 1) + rows


# ------------------------------------------------------- declared field types

T = TypeVar("T")
_Fix = Callable[[str, Any], Any]
"""Check one field's value against its declared type: the value, or a fixed one (raises)."""


def _as_int(name: str, value: Any) -> Any:
    """An integer-like as a plain int; anything else as it is (``validate`` judges it)."""
    if isinstance(value, bool):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def _as_float(name: str, value: Any) -> Any:
    """A NumPy number (``np.float32(0.5)``) as a plain float; anything else as it is
    (``validate`` judges it)."""
    if type(value).__module__ == "numpy" and hasattr(value, "__float__") \
            and type(value).__name__ != "bool":
        return float(value)
    return value


def _as_bool(name: str, value: Any) -> Any:
    if type(value).__name__ == "bool" and type(value).__module__ == "numpy":  # np.bool_
        return bool(value)
    raise InvalidArgument(f"{name} must be True or False, got {value!r}")


def _as_str(name: str, value: Any) -> Any:
    if isinstance(value, str):
        return value
    raise InvalidArgument(f"{name} must be a str, got {value!r}")


def _as_member(kind: type[enum.Enum]) -> _Fix:
    def fix(name: str, value: Any) -> Any:
        try:
            return kind(value)  # the member, or the member of that value ("c2c")
        except (ValueError, TypeError):
            choices = ", ".join(repr(m.value) for m in kind)
            raise InvalidArgument(
                f"{name} must be one of {choices} (a {kind.__name__}), got {value!r}") from None
    return fix


def _nested(name: str, value: Any) -> Any:
    return _fixed(value) if dataclasses.is_dataclass(value) and hasattr(value, "validate") \
        else value


def _held_op(name: str, value: Any) -> Any:
    """An op of a tuple of ops (an ``OpSequence``'s), checked: the memo's own object where
    it keeps ops of its kind, so equal sequences are made of the same ops."""
    return checked(value) if isinstance(value, Op) else value


def _each(fix: _Fix) -> _Fix:
    """``fix`` applied to each item of a tuple (anything else as it is); the same tuple
    when every item comes back as itself."""
    def fix_items(name: str, value: Any) -> Any:
        if not isinstance(value, tuple):
            return value
        items = [fix(name, v) for v in value]
        return value if all(map(operator.is_, items, value)) else tuple(items)
    return fix_items


def _int_tuple(hint: Any) -> bool:
    """Whether ``hint`` declares a tuple of ints (``tuple[int, ...]``, ``tuple[int, int]``)."""
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and bool(args) and all(
        a is int or a is Ellipsis for a in args)


def _op_tuple(hint: Any) -> bool:
    """Whether ``hint`` declares a tuple of ops (``tuple[Op, ...]``)."""
    args = typing.get_args(hint)
    return typing.get_origin(hint) is tuple and bool(args) and isinstance(args[0], type) \
        and issubclass(args[0], Op)


def _rule(hint: Any) -> tuple[tuple[type, ...], _Fix] | None:
    """``(exact types that need no look, fix)`` for a declared field type, or None."""
    plain: tuple[type, ...] = ()
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(rest) != 1:
            return None
        plain, hint = (type(None),), rest[0]
    if hint is bool:
        return (*plain, bool), _as_bool
    if hint is int:
        return (*plain, int), _as_int
    if hint is float:
        return (*plain, float, int), _as_float
    if hint is str:
        return (*plain, str), _as_str
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return (*plain, hint), _as_member(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint) and hasattr(hint, "validate"):
        return plain, _nested  # a part the op validates (a CsrMatrix); not a device-made ref
    if _int_tuple(hint):
        return plain, _each(_as_int)
    if _op_tuple(hint):
        return plain, _each(_held_op)
    return None


_SCALARS: frozenset[type] = frozenset({int, float, complex, bool, str, type(None), GpuRef})
"""The exact value types an op the memo keeps may hold (with its fields' enums, and tuples
of plain ints where a field declares a tuple of ints)."""

_INTS = frozenset({int})


def _atom_types(hints: Mapping[str, Any]) -> tuple[frozenset[type], tuple[int, ...]] | None:
    """The exact types a remembered op's values may have (``_SCALARS``, the enums the fields
    declare, ``tuple`` where one declares a tuple of ints) and the positions of those tuple
    fields; None when a field may hold anything else (that op is never kept)."""
    extra: set[type] = set()
    tuples: list[int] = []
    for position, hint in enumerate(hints.values()):
        parts = typing.get_args(hint) if typing.get_origin(hint) in (
            types.UnionType, typing.Union) else (hint,)
        for part in parts:
            if isinstance(part, type) and issubclass(part, enum.Enum):
                extra.add(part)
            elif _int_tuple(part):
                extra.add(tuple)
                tuples.append(position)
            elif part not in _SCALARS:
                return None
    return _SCALARS | extra, tuple(tuples)


class _Fields:
    """The declared-type checks of one dataclass: its checked fields and their rules."""

    __slots__ = ("atoms", "fixes", "holds_ops", "names", "plain", "rate", "read", "read_all",
                 "tuples")

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        rules = [(f.name, rule) for f in fields if (rule := _rule(hints[f.name])) is not None]
        self.names = tuple(name for name, _ in rules)
        self.plain = tuple(rule[0] for _, rule in rules)
        self.fixes = tuple(rule[1] for _, rule in rules)
        self.read = reader_of(self.names)
        self.read_all = reader_of([f.name for f in fields])
        kept = _atom_types({f.name: hints[f.name] for f in fields})
        self.atoms: frozenset[type] | None = None if kept is None else kept[0]
        self.tuples: tuple[int, ...] = () if kept is None else kept[1]
        self.holds_ops = bool(fields) and all(_op_tuple(hints[f.name]) for f in fields)
        """Every field is a tuple of ops (``OpSequence``): remembered by its ops' identities."""
        self.rate = HitRate()


_FIELDS: dict[type, _Fields] = {}
_holds = tuple.__contains__


def _declared(cls: type) -> _Fields:
    declared = _FIELDS.get(cls)
    if declared is None:
        declared = _FIELDS[cls] = _Fields(cls)
    return declared


MEMO_SIZE = 1024
"""How many checked ops ``checked`` remembers; past it, it forgets them all (dropping the
oldest one by one would cost a scan of a dict's dead slots per op)."""

_Key = tuple[type, tuple[object, ...], tuple[type, ...]]
_MEMO: dict[_Key, Any] = {}
"""``(class, field values, their exact types)`` -> the op ``checked`` made of them."""


_KEPT: dict[int, Any] = {}
"""The ops the memo holds, by ``id``: ``checked`` answers one of them at once (held by the
memo, so its id cannot pass to another object while it is here)."""


def _remember(key: _Key, op: Any) -> None:
    if len(_MEMO) >= MEMO_SIZE:
        _MEMO.clear()
        _KEPT.clear()
    _MEMO[key] = op
    _KEPT[id(op)] = op


def _values_key(declared: _Fields, cls: type, values: tuple[object, ...]) -> _Key | None:
    """The memo's key of an op of ``cls`` with field ``values`` (in field order): the class,
    the values and their exact types; None when they may hold anything but numbers,
    strings, enum members, ``GpuRef``s and tuples of plain ints."""
    if declared.atoms is None:
        return None
    kinds = tuple(map(type, values))
    if not declared.atoms.issuperset(kinds):
        return None
    for position in declared.tuples:
        value = values[position]
        if type(value) is tuple and not _INTS.issuperset(map(type, value)):
            return None  # a bool or a NumPy integer inside: equal to ints, not the same
    return cls, values, kinds


def _memo_key(declared: _Fields, op: object) -> _Key | None:
    """``op``'s key in the memo (``_values_key`` of its class and field values)."""
    if declared.atoms is None:
        return None
    return _values_key(declared, type(op), declared.read_all(op))


def _ops_key(declared: _Fields, op: object) -> _Key | None:
    """The memo's key of an op whose fields are tuples of ops (``holds_ops``): its class and
    its ops' identities, when the memo holds every one of them (else None). A held op's id
    is its own while the memo holds it, and the memo forgets the sequence with it."""
    if not declared.holds_ops:
        return None
    values = cast(tuple[tuple[object, ...], ...], declared.read_all(op))
    if not all(type(ops) is tuple and all(map(kept, ops)) for ops in values):
        return None  # a list in its place, or an op the memo does not hold
    return type(op), tuple(tuple(map(id, ops)) for ops in values), ()


def made(cls: type[T], values: tuple[object, ...]) -> T:
    """An op of ``cls`` with field ``values`` (every field, in order): the checked op the
    memo holds for equal values of the same exact types, else ``cls(*values)``, not yet
    checked. A call that repeats an op so skips making it (a frozen dataclass sets its
    fields one by one) and ``checked`` answers it at once."""
    declared = _declared(cls)
    if not declared.rate.rest:
        key = _values_key(declared, cls, values)
        if key is not None:
            found: T | None = _MEMO.get(key)
            if found is not None:
                declared.rate.hit()
                return found
    return cls(*values)


def _fixed(obj: T) -> T:
    """``obj`` with each checked field as its declared type says (the same object when
    every field already is); raises ``InvalidArgument`` for a wrong option."""
    declared = _declared(type(obj))
    values = declared.read(obj)
    if all(map(_holds, declared.plain, map(type, values))):
        return obj  # every value is of a type that needs no look: the common case
    changes = {}
    for name, value, plain, fix in zip(declared.names, values, declared.plain, declared.fixes,
                                       strict=True):
        if type(value) not in plain and (new := fix(name, value)) is not value:
            changes[name] = new
    return dataclasses.replace(obj, **changes) if changes else obj  # type: ignore[type-var]


def checked(op: T) -> T:
    """Return ``op`` (an op, or another dataclass with a ``validate``) checked and validated.

    Every field is checked against its declared type first (see the module
    docstring): a wrong bool, enum or str option is an ``InvalidArgument``
    naming the choices, and integer-likes become ints, in a copy of the op when
    any field changes. Then ``validate`` runs. Raises ``InvalidArgument``.

    An op made only of numbers, strings, enum members, ``GpuRef``s and tuples of
    plain ints is checked once: the op made of equal values of the same exact types
    is answered from a memo (the same object, so a process host pickles it once),
    since its checks read nothing but those values. A refused op is never remembered,
    and a kind of op whose values keep changing is not looked up for a while
    (``HitRate``).
    """
    if kept(op):  # the memo's own: checked when it was kept
        return op
    declared = _declared(type(op))
    key = None if declared.rate.resting() else _memo_key(declared, op)
    if key is not None:
        found: T | None = _MEMO.get(key)
        if found is not None:
            declared.rate.hit()
            return found
        declared.rate.miss()
    fixed = _fixed(op)
    if key is None and (key := _ops_key(declared, fixed)) is not None:
        sequence: T | None = _MEMO.get(key)
        if sequence is not None:
            return sequence
    fixed.validate()  # type: ignore[attr-defined]
    if key is not None:
        _remember(key, fixed)
    return fixed


def kept(op: object) -> bool:
    """Whether ``op`` is an op the memo holds: a repeated call gives the same object, so
    what is derived from it may be kept by its identity."""
    return _KEPT.get(id(op)) is op


def remembered(op: object) -> bool:
    """Whether ``checked`` keeps ops of ``op``'s kind in its memo now (not resting), and
    ``op`` is made only of numbers, strings, enum members, ``GpuRef``s and tuples of plain
    ints (so it cannot change)."""
    declared = _declared(type(op))
    return not declared.rate.rest and _memo_key(declared, op) is not None


def validated(op: T) -> T:
    """``checked(op)``, with any other failure of a malformed op (a field of a wrong type
    that ``validate`` trips over) reported as ``InvalidArgument`` too; an interrupt of the
    calling thread (a signal handler's exception) is raised unchanged."""
    try:
        return checked(op)
    except InvalidArgument:
        raise
    except Exception as exc:
        if isinstance(exc, GpuRuntimeError) or interrupt_in(exc) is not None:
            raise
        raise InvalidArgument(f"invalid {type(op).__name__}: {exc}") from exc
