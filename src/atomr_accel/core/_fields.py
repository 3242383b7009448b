"""Read a dataclass's field values in field order, and pickle core values by them.

Ops, refs and dtypes travel pickled to worker processes on every call, so
they pickle to as little as rebuilds them: a dataclass as its class and its
field values (unpickling calls the class, never ``validate``), an enum member
as its name. The defaults cost about twice as much: a frozen slotted
dataclass goes through ``copyreg``, ``__getstate__`` and ``__setstate__``
(each looking its fields up again), an enum member through a call of its
class. Pickles of the earlier format still load.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, SupportsIndex

__all__ = ["PickleByFields", "field_values", "immutable", "pickle_by_name", "reader_of"]

_FieldReader = Callable[[object], tuple[object, ...]]
_READERS: dict[type, _FieldReader] = {}


def reader_of(names: Sequence[str]) -> _FieldReader:
    """Return a function that answers an object's values of ``names``, as a tuple."""
    if len(names) == 1:  # attrgetter of one name answers the bare value
        get = attrgetter(names[0])
        return lambda obj: (get(obj),)
    if names:
        read: _FieldReader = attrgetter(*names)
        return read
    return lambda obj: ()


def _reader(cls: type) -> _FieldReader:
    """Return (and remember) a function that answers ``cls``'s field values in field order."""
    read = _READERS[cls] = reader_of([f.name for f in dataclasses.fields(cls)])
    return read


def field_values(obj: object) -> tuple[object, ...]:
    """Return the values of dataclass instance ``obj``'s fields, in field order."""
    cls = type(obj)
    return (_READERS.get(cls) or _reader(cls))(obj)


class PickleByFields:
    """Pickle a dataclass as its class and its field values, in field order.

    Unpickling calls the class with them (its ``__init__`` takes every field
    positionally, as dataclass fields do); ``validate`` does not run.
    """

    __slots__ = ()

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[type, tuple[object, ...]]:
        return type(self), field_values(self)


_ATOMS = (int, float, complex, str, bytes, type(None), enum.Enum)


def immutable(value: object) -> bool:
    """Whether ``value`` is made only of parts that cannot change: numbers, strings, bytes,
    None, enum members, and tuples, frozensets and frozen ``PickleByFields`` dataclasses
    of such parts (an op of refs and numbers: yes; one holding a NumPy array: no)."""
    if isinstance(value, _ATOMS):
        return True
    if isinstance(value, tuple | frozenset):
        return all(immutable(item) for item in value)
    if isinstance(value, PickleByFields):
        params = getattr(type(value), "__dataclass_params__", None)
        return params is not None and params.frozen and all(
            immutable(item) for item in field_values(value))
    return False


def pickle_by_name(member: enum.Enum, proto: object) -> Any:
    """Pickle an enum member as the global ``Class.MEMBER`` (use as ``__reduce_ex__``).

    Typed ``Any``: typeshed's ``Enum.__reduce_ex__`` answers a tuple, but
    pickle takes a global's name as well.
    """
    return f"{type(member).__qualname__}.{member._name_}"
