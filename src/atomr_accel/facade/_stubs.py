"""What is generated from the catalogue as source files: the typed stub of the method sets,
``_api.pyi`` (mypy and IDEs read it, as the methods are made at import time), and
``_handles.py``, which imports every catalogued library's handle class for
``atomr_accel.facade`` and ``atomr_accel`` to export. ``python -m atomr_accel.facade``
writes both anew."""

from __future__ import annotations

import importlib
import pkgutil
import re
import typing
from pathlib import Path

from atomr_accel._public import home
from atomr_accel.core._catalogue import catalogue
from atomr_accel.core._op import Op
from atomr_accel.facade._api import API_SETS
from atomr_accel.facade._device import ACCESSORS
from atomr_accel.facade._generate import Generated, methods_for, render_stub
from atomr_accel.facade._libraries import handle_class

__all__ = ["HANDLES", "STUB", "handles", "stub"]

STUB = Path(__file__).with_name("_api.pyi")
"""Where the typed stub lives."""

HANDLES = Path(__file__).with_name("_handles.py")
"""Where the handle imports live."""

_HANDLES_HEADER = '''"""The catalogued libraries' handle classes, for ``atomr_accel.facade`` and
``atomr_accel`` to export: ``python -m atomr_accel.facade`` writes it from the catalogue."""

'''

_HEADER = '''"""Typed stub of the generated methods: ``python -m atomr_accel.facade`` writes it."""

from collections.abc import Coroutine, Sequence
from typing import Any

'''

_IMPORTS = {  # the names the stub's own lines use
    "atomr_accel.core._op": {"Op"},
    "atomr_accel.core._ref": {"GpuRef"},
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


def _field_classes(op: type[Op]) -> dict[str, type]:
    """The classes named in ``op``'s field types (an enum, a matrix), by name."""
    found: dict[str, type] = {}
    stack = list(typing.get_type_hints(op).values())
    while stack:
        hint = stack.pop()
        if isinstance(hint, type) and hint.__module__ not in ("builtins", "typing"):  # Any
            found[hint.__name__] = hint
        stack.extend(typing.get_args(hint))
    return found


def _signature_classes(sets: list[type[Generated]]) -> dict[str, type]:
    """The classes the generated signatures name, each found in its op's field types;
    ``RuntimeError`` when two ops' signatures name two different classes alike (the stub
    could import only one)."""
    named: dict[str, type] = {}
    for cls in sets:
        for method in methods_for(cls.handle):
            fields = _field_classes(method.op)
            text = " ".join([str(p.annotation) for p in method.signature.parameters.values()]
                            + [method.returns])
            for name in set(re.findall(r"[A-Za-z_]\w*", text)) & fields.keys():
                if named.setdefault(name, fields[name]) is not fields[name]:
                    raise RuntimeError(f"two classes named {name} in the generated signatures")
    return named


def stub() -> str:
    """The text ``_api.pyi`` must hold."""
    _import_facade()  # a new library's handle class, which its accessor's stub names
    sets = sorted(API_SETS.values(), key=lambda cls: cls.__name__)
    modules = {module: set(names) for module, names in _IMPORTS.items()}
    for name, used in _signature_classes(sets).items():
        modules.setdefault(home(used), set()).add(name)
    accessors = []
    for info in ACCESSORS:  # each answers its library's handle
        assert info.handle is not None
        modules.setdefault(home(handle_class(info.handle)), set()).add(info.handle)
        accessors.append(f"    def {info.name}(self, timeout_secs: float | None = ...) -> "
                         f"{info.handle}: ...")
    imports = "".join(_import_line(module, names) for module, names in sorted(modules.items()))
    return render_stub(sets, _HEADER + imports + _BODY, {"DeviceApi": accessors})


def _import_facade() -> None:
    """Import every module of the facade, so that each handle class is defined (a new
    library's handle module is imported by nothing else before ``_handles.py`` is written)."""
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if module.name != "__main__":
            importlib.import_module(f"{__package__}.{module.name}")


def handles() -> str:
    """The text ``_handles.py`` must hold."""
    _import_facade()
    modules: dict[str, set[str]] = {}
    for info in catalogue():
        if info.handle is not None:
            modules.setdefault(home(handle_class(info.handle)), set()).add(info.handle)
    names = sorted(name for names in modules.values() for name in names)
    imports = "".join(_import_line(module, names) for module, names in sorted(modules.items()))
    exports = "".join(f'    "{name}",\n' for name in names)
    return f"{_HANDLES_HEADER}{imports}\n__all__ = [\n{exports}]\n"
