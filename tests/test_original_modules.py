"""The original's module names are declared once in ``atomr_accel.original`` and work as
modules for Python, ``importlib`` and mypy alike."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import atomr_accel
from atomr_accel.original import SHIMS
from atomr_accel.original._shims import render

PACKAGE = Path(atomr_accel.__file__).parent


@pytest.mark.parametrize("name", sorted(SHIMS))
def test_each_module_is_written_from_the_declaration(name: str) -> None:
    assert (PACKAGE / f"{name}.py").read_text() == render(name), \
        "run `python -m atomr_accel.original` to write it again"


@pytest.mark.parametrize("name", sorted(SHIMS))
def test_each_module_offers_what_is_declared(name: str) -> None:
    spec = importlib.util.find_spec(f"atomr_accel.{name}")
    assert spec is not None and spec.origin == str(PACKAGE / f"{name}.py")
    module = importlib.import_module(f"atomr_accel.{name}")
    assert tuple(module.__all__) == SHIMS[name].exported()
    for source, names in SHIMS[name].names:
        for attr in names:
            assert getattr(module, attr) is getattr(importlib.import_module(source), attr)


def test_the_original_imports_keep_working() -> None:
    from atomr_accel import _native
    from atomr_accel.blas import Blas
    from atomr_accel.system import System

    assert Blas is atomr_accel.Blas and System is atomr_accel.System
    assert _native.Device is atomr_accel.Device and _native.DeviceLoad is atomr_accel.DeviceLoad


def test_import_atomr_accel_loads_none_of_them() -> None:
    """The original's top-level modules load only when imported by name (the blueprint
    packages take their original forms from ``atomr_accel.original`` itself)."""
    code = ("import sys, atomr_accel; from atomr_accel.original import SHIMS; "
            "print(sorted(n for n in SHIMS if 'atomr_accel.' + n in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_device_tier_offers_the_originals_device_names() -> None:
    import atomr_accel.device
    from atomr_accel.original import DEVICE_NAMES

    for name in DEVICE_NAMES:
        assert getattr(atomr_accel.device, name) is getattr(atomr_accel, name)
    with pytest.raises(AttributeError):
        atomr_accel.device.Nothing  # noqa: B018


def test_mypy_reads_them_as_typed_modules(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    user = tmp_path / "user.py"
    user.write_text(
        "from atomr_accel.blas import Blas\n"
        "from atomr_accel.cub import ReduceKind\n"
        "from atomr_accel.system import System\n\n"
        "def run(system: System, blas: Blas) -> ReduceKind:\n"
        "    return ReduceKind.SUM\n")
    # mypy reads the three modules themselves and skips what they import (fast)
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nstrict = True\nfollow_imports = skip\n"
        "[mypy-atomr_accel.blas,atomr_accel.cub,atomr_accel.system]\nfollow_imports = normal\n")
    env = {**os.environ, "MYPYPATH": str(PACKAGE.parent)}  # this package, not another copy
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", str(user)],
                         capture_output=True, text=True, cwd=tmp_path, check=False, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    user.write_text("from atomr_accel.blas import Nothing\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", str(user)],
                         capture_output=True, text=True, cwd=tmp_path, check=False, env=env)
    assert out.returncode == 1 and "Nothing" in out.stdout
