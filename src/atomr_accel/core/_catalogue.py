"""The catalogue of libraries: each library declared once, in its own op module.

A library is a family of ops run by one kernel actor on its own stream
(``"blas"``, ``"fft"``, ...). Its op module declares it with ``declare``; the
list of libraries a device can enable, the kernel actors, the facade's method
sets and ``Device`` accessors and the typed stubs are all derived from the
catalogue, so a new library edits no shared list. ``catalogue()`` imports
every op module first, so it is complete whatever was imported before.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

from atomr_accel.core._errors import InvalidArgument

__all__ = ["LibraryInfo", "catalogue", "declare", "library", "load_op_modules"]


@dataclass(frozen=True, slots=True)
class LibraryInfo:
    """One library: its ``name`` (what ops name as their ``library``), ``title`` (the word
    of its class names: ``BlasActor``, ``BlasApi``), a one-line ``summary``, its ``rank`` in
    the list of libraries (the order they were added in), the class name of its facade
    ``handle`` (None: it has none, or a handle built by hand), whether a graph may record
    its ops (``capturable``: pure device work, but the ops that answer a host value) and
    whether an ``OpSequence`` may hold them (``sequenced``: all but the libraries whose ops
    make handles or wait for other ranks)."""

    name: str
    title: str
    summary: str
    rank: int
    handle: str | None = None
    capturable: bool = False
    sequenced: bool = True


_DECLARED: dict[str, LibraryInfo] = {}


def declare(name: str, title: str, summary: str, *, rank: int, handle: str | None = None,
            capturable: bool = False, sequenced: bool = True) -> str:
    """Add a library to the catalogue (once, in its op module); return its name.

    Raises ``InvalidArgument`` when another library holds the name or the rank.
    """
    info = LibraryInfo(name, title, summary, rank, handle, capturable, sequenced)
    held = _DECLARED.get(name)
    if held is not None and held != info:
        raise InvalidArgument(f"library {name!r} is declared twice")
    if any(other.rank == rank and other.name != name for other in _DECLARED.values()):
        raise InvalidArgument(f"library {name!r} takes rank {rank}, which another one holds")
    _DECLARED[name] = info
    catalogue.cache_clear()
    _by_name.cache_clear()
    return name


@functools.cache
def load_op_modules() -> None:
    """Import every module of ``atomr_accel.core.ops`` (their declarations register)."""
    from atomr_accel.core import ops

    for info in pkgutil.iter_modules(ops.__path__):
        importlib.import_module(f"{ops.__name__}.{info.name}")


@functools.cache
def catalogue() -> tuple[LibraryInfo, ...]:
    """Every declared library, in rank order."""
    load_op_modules()
    return tuple(sorted(_DECLARED.values(), key=lambda info: info.rank))


@functools.cache
def _by_name() -> dict[str, LibraryInfo]:
    return {info.name: info for info in catalogue()}


def library(name: str) -> LibraryInfo:
    """The declaration of library ``name``; ``InvalidArgument`` for an unknown name."""
    info = _by_name().get(name)
    if info is None:
        known = ", ".join(info.name for info in catalogue())
        raise InvalidArgument(f"unknown library {name!r}; choose from {known}")
    return info
