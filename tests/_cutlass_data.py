"""Data helpers of the CUTLASS tests: random operands by dtype name, and buffers in and out."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

from atomr_accel import DType


def np_dtype(name: str) -> Any:
    """The NumPy dtype of a dtype name (``"bf16"`` through ml_dtypes)."""
    return np.dtype(ml_dtypes.bfloat16) if name == "bf16" else np.dtype(DType(name).numpy)


def rand(shape: tuple[int, ...], name: str, seed: int) -> np.ndarray[Any, Any]:
    """Standard-normal values of ``shape`` in dtype ``name``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np_dtype(name))


def put(dev: Any, values: np.ndarray[Any, Any], name: str) -> Any:
    """A buffer of dtype ``name`` holding ``values`` (one element for an empty array)."""
    buf = dev.allocate(max(values.size, 1), DType(name))
    if values.size:
        dev.copy_from_numpy(buf, values.reshape(-1))
    return buf


def get(dev: Any, buf: Any, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
    """The first ``prod(shape)`` elements of ``buf``, shaped."""
    return np.asarray(dev.copy_to_numpy(buf))[: math.prod(shape)].reshape(shape)
