"""Public names report their public module, as httpx's do.

Implementation lives in private modules (``facade/_libraries.py``); users meet
it through public ones (``atomr_accel.Blas``). ``publish`` makes the classes
and functions a public module exports say so: their ``__module__`` (and that of
their methods, the generated ones included, whose ``__qualname__`` becomes
``Blas.gemm_f32``) names the public module, so reprs, tracebacks, ``help()``
and pickles show the path a user imports.

The rule, one for the whole package: a name reports the **first** public module
that publishes it. ``atomr_accel/__init__.py`` publishes, in order,
``atomr_accel.errors`` (every exception class but those of the actor runtime and
the command-line tool, which stay with their own packages), the actor runtime
(usable on its own), ``atomr_accel`` and then the other subpackages (``PUBLIC``
below); a package imported only when asked for (``atomr_accel.streams``,
``atomr_accel.cli``, the original's module names) publishes its names at the
end of its own import, leaving those that already report a public module.

A name stays importable where it reports to be, so pickles keep working. A
class's string annotations that would read otherwise in the public module are
resolved before its ``__module__`` changes (where they can be), since
``typing.get_type_hints`` reads a class's annotations in the namespace its
``__module__`` names.
"""

from __future__ import annotations

import functools
import re
import sys
from types import FunctionType

__all__ = ["PUBLIC", "home", "is_public", "publish"]

PUBLIC = (
    "atomr_accel.errors",
    "atomr_accel.actor",
    "atomr_accel",
    "atomr_accel.blueprint",
    "atomr_accel.patterns",
    "atomr_accel.train",
    "atomr_accel.agents",
    "atomr_accel.realtime",
    "atomr_accel.telemetry",
    "atomr_accel.core",
    "atomr_accel.device",
    "atomr_accel.facade",
    "atomr_accel.hosts",
)
"""The public modules ``atomr_accel`` publishes when it is imported, first claim first."""

_GENERATED = "atomr_accel.facade._generate"


def is_public(module: str) -> bool:
    """Whether ``module`` is one of the package's public module names (no ``_`` part)."""
    parts = module.split(".")
    return parts[0] == "atomr_accel" and not any(p.startswith("_") for p in parts[1:])


def publish(module: str) -> None:
    """Make each class and function ``module.__all__`` exports that still reports a
    private module of the package report ``module`` instead (with its methods).

    A name exported under another name (``DeviceLoad`` for ``DeviceStats``) is left
    to a module that exports it under its own, where a pickle can find it.
    """
    namespace = vars(sys.modules[module])
    for name in namespace["__all__"]:
        obj = namespace.get(name)  # None: loaded on first use (a module ``__getattr__``)
        if isinstance(obj, type | FunctionType) and obj.__name__ == name and _claimable(obj):
            if isinstance(obj, type):
                _publish_class(obj, module)
                _homes[obj] = obj.__module__
            obj.__module__ = module


_homes: dict[type, str] = {}


def home(cls: type) -> str:
    """The module that defines ``cls`` (its ``__module__`` before it was published): an
    import of it from there never depends on which public modules were imported."""
    return _homes.get(cls, cls.__module__)


def _claimable(obj: type | FunctionType) -> bool:
    """Whether ``obj`` is the package's own and reports a private module still."""
    owner = obj.__module__ or ""
    return owner.startswith("atomr_accel.") and not is_public(owner)


_walked: set[type] = set()
"""The classes whose methods have been given a public module (each is walked once)."""


def _publish_class(cls: type, module: str) -> None:
    """Give ``cls``'s methods, and those of its private bases, the public ``module``."""
    _resolve_annotations(cls, module)
    for base in cls.__mro__:
        owner = base.__module__
        if base in _walked or (base is not cls and (
                not owner.startswith("atomr_accel.") or is_public(owner))):
            continue
        _walked.add(base)
        for attr, member in vars(base).items():
            kind = type(member)
            if kind is FunctionType:
                _publish_function(member, cls, attr, owner, module)
            elif kind is staticmethod or kind is classmethod or kind is property:
                for function in _functions_of(member):
                    _publish_function(function, cls, attr, owner, module)


def _publish_function(function: FunctionType, cls: type, attr: str, owner: str,
                      module: str) -> None:
    """Give a method of ``cls`` (``attr``), written in ``owner`` or generated, ``module``."""
    written = function.__module__
    if written == owner:
        function.__module__ = module
    elif written == _GENERATED:
        function.__qualname__ = f"{cls.__qualname__}.{attr}"
        function.__module__ = module


def _functions_of(member: object) -> tuple[FunctionType, ...]:
    """The plain functions behind a static or class method or a property."""
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    accessors = ((member.fget, member.fset, member.fdel) if isinstance(member, property)
                 else (member,))
    return tuple(f for f in accessors if type(f) is FunctionType)


def _resolve_annotations(cls: type, module: str) -> None:
    """Keep ``cls``'s annotations readable (``typing.get_type_hints``, which dataclass
    checks and subclasses' hints use) once it reports ``module``: evaluate, in its
    defining module, each string annotation that would read otherwise there (the rest
    stay strings, which cost nothing at import)."""
    annotations = vars(cls).get("__annotations__")
    if not annotations:
        return
    private = cls.__module__
    local: dict[str, object] | None = None
    for key, text in annotations.items():
        if type(text) is str and not _reads_alike(text, private, module):
            local = dict(vars(cls)) if local is None else local
            try:
                annotations[key] = eval(text, vars(sys.modules[private]), local)
            except Exception:  # a name only a type checker sees: it stays a string
                continue


@functools.cache
def _reads_alike(text: str, private: str, public: str) -> bool:
    """Whether the annotation ``text`` names the same objects in both modules."""
    one, other = vars(sys.modules[private]), vars(sys.modules[public])
    return all(one.get(name, _MISSING) is other.get(name, _MISSING)
               for name in _NAMES.findall(text))


_NAMES = re.compile(r"\b[A-Za-z_]\w*")
"""The names an annotation looks up (an attribute's name after a dot does no harm)."""
_MISSING = object()
