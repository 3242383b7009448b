"""Modules a backend imports on first use, not when its handlers register.

Building a backend imports every handler module of its package (their
registrations make its table), and a context worker builds one at every start.
SciPy's and cupyx's submodules take about half a second to import: a handler
module names them with ``lazy_module`` and they load when a handler first uses
them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["lazy_module"]


class _LazyModule:
    """Stands for module ``name``: the first attribute asked of it imports the module."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):  # a probe (abc's, copy's): not a use
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported on first use>"


def lazy_module(name: str) -> Any:
    """Module ``name`` (``"scipy.special"``), imported when an attribute is first asked of
    it; ``import_module``'s cache makes later lookups cheap."""
    return _LazyModule(name)
