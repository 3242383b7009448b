"""A process-host worker starts without the package's public API (the facade, the
blueprints), which its start would otherwise pay for on every rebuild; the first time
code in the worker asks the package for a name, the package's ``__init__`` runs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

import atomr_accel
from atomr_accel import Device, System

UPPER = ("facade", "blueprint", "patterns", "agents", "train", "realtime", "streams",
         "telemetry", "original")


@pytest.fixture(scope="module")
def device() -> Iterator[Device]:
    with System.open("boot") as system:
        yield system.spawn_device(mock=True, isolation="process")


# Lambdas travel by value (a function of this module would travel by reference, and its
# import in the worker would import the package's API).
upper_layers_loaded = lambda x: np.array(  # noqa: E731 - see above
    [layer in {n.split(".")[1] for n in sys.modules if n.startswith("atomr_accel.")}
     for layer in UPPER], dtype=np.float64) + 0 * x[:1]
the_package_answers = lambda x: x * float(atomr_accel.DType.F64.itemsize)  # noqa: E731


def test_a_worker_imports_no_upper_layer_until_asked(device: Device) -> None:
    before = device.function(upper_layers_loaded, name="layers")(np.zeros(1))
    assert not before.any(), dict(zip(UPPER, before, strict=True))
    out = device.function(the_package_answers, name="package")(np.arange(3.0))
    np.testing.assert_array_equal(out, np.arange(3.0) * 8)
    after = device.function(upper_layers_loaded, name="layers")(np.zeros(1))
    assert after[UPPER.index("facade")] == 1  # the package's __init__ ran on demand


def test_a_backend_is_built_without_importing_scipy() -> None:
    """The handler modules register without importing SciPy (``backends._lazy``): it loads
    when a handler first uses it."""
    code = ("import sys; from atomr_accel.hosts._base import BackendSpec; "
            "BackendSpec('cpu').create(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
