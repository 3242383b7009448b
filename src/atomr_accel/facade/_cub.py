"""The ``Cub`` handle: CUB's device-wide primitives on one device (``dev.cub()``).

Its methods come from the ops' declarations (``atomr_accel.core.ops._cub``):
reduce (sum, min, max, argmin, argmax, a custom C operator), inclusive and
exclusive scans, stable radix sorts of keys and of key-value pairs, even and
ranged histograms, select and partition by flags or a C predicate, unique,
run-length encoding, and segmented reduce and sort. On CUDA they run CuPy's
CUB-backed routines and small CuPy kernels on the op's stream; on the CPU, NumPy.
"""

from __future__ import annotations

from atomr_accel.facade._api import CubApi
from atomr_accel.facade._libraries import Library

__all__ = ["Cub"]


class Cub(Library, CubApi):
    """CUB's device primitives on one device, in the original package's name; its
    ``reduce_sum_f32(input, output, ts=10.0)`` is the original's one method."""

    def __repr__(self) -> str:
        return f"Cub(device={self.device.device_id})"
