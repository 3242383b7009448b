"""Attach the original package's op forms to the package's own ops.

Each ``atomr_accel.original._<library>_forms`` module attaches the forms of one
library (``core._api.attach``). ``atomr_accel`` imports this module, which
imports all of them, so the facade offers the original's methods whatever was
imported first (a method set made before a form is attached receives it then).
"""

from __future__ import annotations

import importlib
import pkgutil

import atomr_accel.original as _package

__all__ = ["FORM_MODULES"]

FORM_MODULES: tuple[str, ...] = tuple(
    info.name for info in pkgutil.iter_modules(_package.__path__)
    if info.name.endswith("_forms") and info.name != __name__.rpartition(".")[2]
)
"""The modules that attach the original's forms, one per library."""

for _name in FORM_MODULES:
    importlib.import_module(f"{_package.__name__}.{_name}")
