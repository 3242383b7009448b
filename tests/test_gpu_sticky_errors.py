"""A library call caught by a sticky fault of another stream may report it in its own
words (cuBLAS: ``CUBLAS_STATUS_INTERNAL_ERROR``): the CUDA backend checks the context and
answers ``ContextPoisoned``, so the device rebuilds instead of failing the call with a
``LibraryError``. The fault ends the process's CUDA context, so it runs in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent("""
    import cupy as cp
    from atomr_accel.backends.cuda._backend import CudaBackend, translate_cuda_error
    from atomr_accel.core._op import Op

    backend = CudaBackend(0)
    op = Op()
    library_error = RuntimeError("CUBLAS_STATUS_INTERNAL_ERROR")
    print(type(translate_cuda_error(library_error, op, probe=True)).__name__)
    bad = cp.RawKernel(
        'extern "C" __global__ void bad() { *(volatile float*)0xDEAD0000ull = 1.0f; }', "bad")
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        bad((1,), (1,), ())
    try:
        side.synchronize()
    except Exception as exc:  # the fault itself: error 700
        print("fault", getattr(exc, "status", None))
    print(type(translate_cuda_error(library_error, op, probe=True)).__name__)
    print(type(translate_cuda_error(library_error, op)).__name__)
""")


def test_a_library_error_in_a_poisoned_context_is_context_poisoned() -> None:
    pytest.importorskip("cupy")
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=False, timeout=120)
    lines = out.stdout.split()
    assert lines[:4] == ["LibraryError", "fault", "700", "ContextPoisoned"], out.stdout + out.stderr
    assert lines[4] == "LibraryError"  # without the probe (a CUDA callback): as it was
