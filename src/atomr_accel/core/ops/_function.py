"""Ops that run users' own code inside a device's context: device functions and residents.

A ``CallFunction`` carries the user's function (``UserCode``), its arguments
(``Packed``) and the buffers they name; ``BuildResident`` and ``FreeResident``
make and drop a resident (a user object that lives in the context). They travel
like every op: on the thread host as they are (nothing is pickled), to a worker
process or a Ray actor as pickles. The function is pickled once per
``UserCode`` (cloudpickle: lambdas and closures travel too; a module-level
function by reference) and unpickled once per process that runs it.
"""

from __future__ import annotations

import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef

__all__ = [
    "ARRAY_KINDS",
    "BufferArg",
    "BuildResident",
    "CallFunction",
    "FreeResident",
    "HostArrayArg",
    "Kept",
    "Packed",
    "ResidentArg",
    "UserCode",
]

ARRAY_KINDS = ("auto", "numpy", "cupy", "torch")
"""What a device function's arrays are inside the context (``arrays=``)."""

_LOADED_LIMIT = 1024
_loaded: OrderedDict[int, UserCode] = OrderedDict()
_loaded_lock = threading.Lock()


def _dumps(value: Any) -> bytes:
    """``value`` pickled: plainly when it can be, else with cloudpickle (lambdas, closures,
    classes defined in ``__main__``)."""
    try:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        import cloudpickle

        return bytes(cloudpickle.dumps(value, pickle.HIGHEST_PROTOCOL))


class UserCode:
    """A user's callable and its pickle, made once (``payload``) and only if it travels.

    ``token`` names it across processes: a process keeps the code of a token it
    has seen (at most ``_LOADED_LIMIT`` codes, the oldest dropped) and unpickles
    its function once, when it first runs (``function()``), so that a function
    that cannot be loaded there fails its call, typed, rather than the op's transport.
    """

    __slots__ = ("_fn", "_payload", "name", "token")

    def __init__(self, fn: Callable[..., Any] | None, name: str, token: int,
                 payload: bytes | None = None) -> None:
        self._fn = fn
        self.name = name
        self.token = token
        self._payload = payload

    def function(self) -> Callable[..., Any]:
        """The callable (unpickled here the first time; raises what unpickling raises)."""
        fn = self._fn
        if fn is None:
            assert self._payload is not None
            fn = self._fn = pickle.loads(self._payload)
        return fn

    @property
    def payload(self) -> bytes:
        """The function pickled (cloudpickle: lambdas and closures by value), made once."""
        if self._payload is None:
            import cloudpickle

            self._payload = bytes(cloudpickle.dumps(self._fn, pickle.HIGHEST_PROTOCOL))
        return self._payload

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_code, (self.token, self.name, self.payload))

    def __eq__(self, other: object) -> bool:
        """The same code: the same token (in any process) and name."""
        if not isinstance(other, UserCode):
            return NotImplemented
        return (self.token, self.name) == (other.token, other.name)

    def __hash__(self) -> int:
        return hash(self.token)

    def __repr__(self) -> str:
        return f"UserCode({self.name!r})"


def _load_code(token: int, name: str, payload: bytes) -> UserCode:
    """The code of ``token`` in this process (its function unpickled once, on first use)."""
    with _loaded_lock:
        code = _loaded.get(token)
        if code is not None:
            _loaded.move_to_end(token)
            return code
        code = _loaded[token] = UserCode(None, name, token, payload)
        while len(_loaded) > _LOADED_LIMIT:
            _loaded.popitem(last=False)
    return code


class Packed:
    """A function's arguments ``(args, kwargs)``: kept as they are in this process, pickled
    on their own when the op travels (plainly, else with cloudpickle) and unpickled where
    they are used (``unpack()``). An argument that cannot be pickled makes the op refuse to
    travel (``InvalidArgument``, nothing sent).

    ``arrays`` are large host arrays the arguments name by ``HostArrayArg``: they travel
    beside the pickle, each host its own way (the process host through shared memory, in
    place of the tuple while the op is on its way: ``with_arrays``).
    """

    __slots__ = ("_args", "_payload", "arrays")

    def __init__(self, args: tuple[Any, ...] | None, kwargs: dict[str, Any] | None,
                 payload: bytes | None = None, arrays: Any = ()) -> None:
        self._args = None if args is None else (args, kwargs or {})
        self._payload = payload
        self.arrays = arrays

    def with_arrays(self, arrays: Any) -> Packed:
        """The same arguments with ``arrays`` in place of this one's."""
        packed = Packed(None, None, self._payload, arrays)
        packed._args = self._args
        return packed

    def unpack(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` (unpickled here the first time; raises what unpickling raises)."""
        unpacked = self._args
        if unpacked is None:
            assert self._payload is not None
            unpacked = self._args = pickle.loads(self._payload)
        return unpacked

    def pickled(self) -> bytes:
        """The arguments' pickle, made once and kept (``__reduce__`` sends it): it holds
        them as they are now, whatever the caller does with them later. Raises what
        pickling raises."""
        payload = self._payload
        if payload is None:
            payload = self._payload = _dumps(self._args)
        return payload

    def __reduce__(self) -> tuple[Any, ...]:
        payload = self._payload
        if payload is None:
            payload = _dumps(self._args)
        return (Packed, (None, None, payload, self.arrays))

    def __eq__(self, other: object) -> bool:
        """Equal arguments once unpacked (False where they cannot be compared: arrays)."""
        if not isinstance(other, Packed):
            return NotImplemented
        mine, theirs = self.arrays, other.arrays
        if mine is not theirs and not (
                isinstance(mine, tuple) and isinstance(theirs, tuple) and len(mine) == len(theirs)
                and all(a is b for a, b in zip(mine, theirs, strict=True))):
            return False  # the same arrays: the same objects
        try:
            return bool(self.unpack() == other.unpack())
        except Exception:
            return False

    def __hash__(self) -> int:  # one value for all: the arguments may be unhashable
        return hash(Packed)

    def __repr__(self) -> str:
        return "Packed(...)"


@dataclass(frozen=True, slots=True)
class BufferArg:
    """Stands for the ``index``-th buffer of a ``CallFunction`` among its arguments."""

    index: int


@dataclass(frozen=True, slots=True)
class HostArrayArg:
    """Stands for the ``index``-th of a ``Packed``'s large host arrays among its arguments:
    the context receives a copy of it (uploaded on CUDA)."""

    index: int


@dataclass(frozen=True, slots=True)
class ResidentArg:
    """Stands for the resident ``token`` (named ``name``) among a function's arguments."""

    token: int
    name: str


@dataclass(frozen=True, slots=True)
class Kept:
    """A device array a function returned with ``keep=True``: a new buffer of the context."""

    buffer_id: int
    dtype: str
    length: int


@dataclass(frozen=True, slots=True)
class CallFunction(Op):
    """Run ``code`` on ``args`` inside the context; answer what it returns.

    ``buffers`` are the buffers named by ``BufferArg``s in ``args``: each arrives
    as a writable array view (``arrays`` picks NumPy, CuPy or torch), so every one
    counts as read and written. ``keep`` leaves returned device arrays in the
    context as new buffers (``Kept``). ``pure`` says the call may run again on a
    new context after its own died under it.
    """

    code: UserCode
    args: Packed
    buffers: tuple[GpuRef, ...] = ()
    arrays: str = "auto"
    keep: bool = False
    pure: bool = False

    def refs(self) -> tuple[GpuRef, ...]:
        """The buffers its arguments name."""
        return self.buffers

    def writes(self) -> tuple[GpuRef, ...]:
        """The buffers its arguments name: the function may write any of them."""
        return self.buffers


@dataclass(frozen=True, slots=True)
class BuildResident(Op):
    """Run ``code`` (a resident's factory) on ``args`` and keep its result in the context
    under ``token``; a context that holds ``token`` already keeps what it has."""

    token: int
    code: UserCode
    args: Packed


@dataclass(frozen=True, slots=True)
class FreeResident(Op):
    """Drop the resident ``token`` from the context (nothing if it holds none)."""

    token: int
