"""The typed stub of the generated method sets, ``_api.pyi``: mypy and IDEs read it, as the
methods are made at import time. ``python -m atomr_accel.facade`` writes it anew."""

from __future__ import annotations

from pathlib import Path

from atomr_accel.facade._api import (
    BlasApi,
    BlasLtApi,
    CubApi,
    CudnnApi,
    CutlassApi,
    DeviceApi,
    FftApi,
    FlashAttnApi,
    RngApi,
    SolverApi,
    SparseApi,
    TensorApi,
)
from atomr_accel.facade._generate import render_stub

__all__ = ["STUB", "stub"]

STUB = Path(__file__).with_name("_api.pyi")
"""Where the typed stub lives."""

_HEADER = '''"""Typed stub of the generated methods: ``python -m atomr_accel.facade`` writes it."""

from collections.abc import Coroutine, Sequence
from typing import Any

from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._attention import AttnLayout, AttnMask
from atomr_accel.core.ops._cub import ReduceKind, ScanKind
from atomr_accel.core.ops._cutlass import Epilogue
from atomr_accel.core.ops._dnn import Layout
from atomr_accel.core.ops._faults import FaultKind
from atomr_accel.core.ops._fft import FftKind
from atomr_accel.core.ops._sparse import CsrMatrix
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._generate import Generated

BufferLike = GpuBuffer | GpuRef
'''


def stub() -> str:
    """The text ``_api.pyi`` must hold."""
    sets = [BlasApi, BlasLtApi, CubApi, CudnnApi, CutlassApi, DeviceApi, FftApi, FlashAttnApi,
            RngApi, SolverApi, SparseApi, TensorApi]
    return render_stub(sets, _HEADER)
