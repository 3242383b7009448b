"""Handlers registered where they are written; each backend's table is built from them.

A handler runs one op class on a backend: ``handler(backend, op)``. It is
registered with a decorator beside its definition: ``@cpu.handles(Fft)`` for
the CPU backend, ``@cuda.handles(Gemm)`` for CUDA, and ``@shared.handles(CsrSpMV)``
for one handler that serves both (it computes with the backend's array module,
NumPy or CuPy). ``table`` imports every module of a backend's package (and the
CPU package, where the shared handlers are written) and answers the backend's
table: the shared handlers, then its own, which take the place of a shared one
for the same op. A handler registered later (its module imported after the
backend's) joins the tables built already. So a new library adds handler
modules and edits no list.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from atomr_accel.backends._base import Handler
from atomr_accel.core._op import Op

__all__ = ["Entry", "Registry", "cpu", "cuda", "shared", "table"]

H = TypeVar("H", bound=Callable[..., Any])


class Entry(NamedTuple):
    """One registration: the handler, and whether the CPU backend runs it with NumPy's
    floating-point warnings off (``quiet``: it computes through NaN and overflow as a GPU
    kernel does)."""

    handler: Handler
    quiet: bool


Wrap = Callable[[Handler], Handler]


class Registry:
    """The handlers one backend (or both: ``shared``) registered, by op class."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[type[Op], Entry] = {}
        self.tables: list[tuple[Registry, dict[type[Op], Any], Wrap | None]] = []
        """The tables built from these entries: (their backend's registry, table, quiet)."""

    def register(self, op: type[Op], handler: Handler, *,
                 quiet: bool = False) -> None:
        """Register ``handler`` for ``op``; ``TypeError`` if another handler holds it."""
        held = self.entries.get(op)
        if held is not None and held.handler is not handler:
            raise TypeError(f"{op.__name__} has two {self.name} handlers: "
                            f"{held.handler.__qualname__} and {handler.__qualname__}")
        self.entries[op] = Entry(handler, quiet)
        for own, built, wrap in self.tables:
            if own is self or op not in own.entries:  # a backend's own handler wins
                built[op] = _wrapped(self.entries[op], wrap)

    def register_all(self, handlers: Mapping[type[Op], Handler], *,
                     quiet: bool = False) -> None:
        """Register each handler of ``handlers`` for its op."""
        for op, handler in handlers.items():
            self.register(op, handler, quiet=quiet)

    def handles(self, *ops: type[Op], quiet: bool = False) -> Callable[[H], H]:
        """Decorate the handler of ``ops`` (one or more op classes); returns it unchanged."""
        def decorate(handler: H) -> H:
            for op in ops:
                self.register(op, handler, quiet=quiet)
            return handler

        return decorate


cpu = Registry("cpu")
"""Handlers of the CPU backend alone."""
cuda = Registry("cuda")
"""Handlers of the CUDA backend alone."""
shared = Registry("shared")
"""Handlers both backends run (written in the CPU package, with the backend's array module)."""


@functools.cache
def _load(package: str) -> None:
    """Import every module of ``package`` (their registrations run)."""
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__):
        importlib.import_module(f"{package}.{info.name}")


def _wrapped(entry: Entry, quiet: Wrap | None) -> Handler:
    return quiet(entry.handler) if quiet is not None and entry.quiet else entry.handler


def table(own: Registry, package: str, base: Mapping[type[Op], Handler],
          quiet: Wrap | None = None) -> dict[type[Op], Handler]:
    """The handler table of the backend whose handlers ``own`` holds, written in
    ``package``: ``base`` (the context's own ops), the shared handlers, then its own.
    ``quiet`` wraps the handlers registered ``quiet`` (None: they run as they are)."""
    _load("atomr_accel.backends.cpu")
    _load(package)
    entries = shared.entries | own.entries
    built = dict(base) | {op: _wrapped(entry, quiet) for op, entry in entries.items()}
    for registry in (own, shared):
        registry.tables.append((own, built, quiet))
    return built
