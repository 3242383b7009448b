"""The typed stub of the generated method sets, ``_api.pyi``: mypy and IDEs read it, as the
methods are made at import time. ``python -m atomr_accel.facade`` writes it anew."""

from __future__ import annotations

from pathlib import Path

from atomr_accel.facade._api import API_SETS
from atomr_accel.facade._device import ACCESSORS
from atomr_accel.facade._generate import render_stub
from atomr_accel.facade._libraries import handle_class

__all__ = ["STUB", "stub"]

STUB = Path(__file__).with_name("_api.pyi")
"""Where the typed stub lives."""

_HEADER = '''"""Typed stub of the generated methods: ``python -m atomr_accel.facade`` writes it."""

from collections.abc import Coroutine, Sequence
from typing import Any

'''

_IMPORTS = {  # the names the signatures use
    "atomr_accel.core._op": {"Op"},
    "atomr_accel.core._ref": {"GpuRef"},
    "atomr_accel.core.ops._attention": {"AttnLayout", "AttnMask"},
    "atomr_accel.core.ops._cub": {"ReduceKind", "ScanKind"},
    "atomr_accel.core.ops._cutlass": {"Epilogue"},
    "atomr_accel.core.ops._dnn": {"Layout"},
    "atomr_accel.core.ops._faults": {"FaultKind"},
    "atomr_accel.core.ops._fft": {"FftKind"},
    "atomr_accel.core.ops._sparse": {"CsrMatrix"},
    "atomr_accel.facade._buffers": {"GpuBuffer"},
    "atomr_accel.facade._generate": {"Generated"},
}

_BODY = '''
BufferLike = GpuBuffer | GpuRef

API_SETS: dict[str, type[Generated]]
'''


def _import_line(module: str, names: set[str]) -> str:
    """``from module import names``, wrapped in parentheses, one name a line, past 100
    characters (as ruff formats it)."""
    line = f"from {module} import {', '.join(sorted(names))}\n"
    if len(line) <= 101:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in sorted(names)) + ")\n"


def stub() -> str:
    """The text ``_api.pyi`` must hold."""
    sets = sorted(API_SETS.values(), key=lambda cls: cls.__name__)
    modules = {module: set(names) for module, names in _IMPORTS.items()}
    accessors = []
    for info in ACCESSORS:  # each answers its library's handle
        assert info.handle is not None
        modules.setdefault(handle_class(info.handle).__module__, set()).add(info.handle)
        accessors.append(f"    def {info.name}(self, timeout_secs: float | None = ...) -> "
                         f"{info.handle}: ...")
    imports = "".join(_import_line(module, names) for module, names in sorted(modules.items()))
    return render_stub(sets, _HEADER + imports + _BODY, {"DeviceApi": accessors})
