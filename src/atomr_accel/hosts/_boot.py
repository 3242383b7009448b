"""The worker process's first code, run by its path: ``python -P -s _boot.py MODULE``.

A context worker needs the device tier's lower layers (core, backends, hosts),
not the package's public API, whose eager import (the facade's generated
methods, the blueprints) would add about a second to every cold start, and so
to every rebuild that finds no warm standby. Run by path, this file is not part
of the ``atomr_accel`` package: it registers the package without running its
``__init__``, which runs at the first attribute the worker's code asks of the
package itself (an object pickled by reference to ``atomr_accel.Device``, say),
and then runs ``MODULE``'s ``main()``. ``MODULE`` stays on the command line, so
tools that look for context workers by it still find them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from importlib.machinery import ModuleSpec
from typing import Any

PACKAGE = "atomr_accel"


class _Deferred(types.ModuleType):
    """The package, its ``__init__`` not run yet: the first missing attribute runs it."""

    def __getattr__(self, name: str) -> Any:
        spec = self.__spec__
        assert isinstance(spec, ModuleSpec) and spec.loader is not None
        object.__setattr__(self, "__class__", types.ModuleType)  # once: then ordinary lookups
        spec.loader.exec_module(self)
        return getattr(self, name)


def defer_package() -> None:
    """Register ``atomr_accel`` in ``sys.modules`` without running its ``__init__``."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"{PACKAGE} is not importable in this worker", name=PACKAGE)
    package = importlib.util.module_from_spec(spec)
    package.__class__ = _Deferred
    sys.modules[PACKAGE] = package


if __name__ == "__main__":
    defer_package()
    importlib.import_module(sys.argv[1]).main()
