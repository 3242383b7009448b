"""Random matrices and column-major packing shared by the CPU and GPU solver tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.core import DType

Arr = np.ndarray[Any, Any]

FILL = -777.0  # marks padding and gaps that an op must not touch


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Random values already rounded to ``dtype``, held in float64/complex128."""
    x = rng.standard_normal(shape)
    if dtype.is_complex:
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def hpd(rng: np.random.Generator, n: int, dtype: DType) -> Arr:
    """A random Hermitian positive definite matrix rounded to ``dtype``."""
    m = rand(rng, (n, n), dtype)
    return (m @ m.conj().T + n * np.eye(n)).astype(dtype.numpy).astype(m.dtype)


def pack(mat: Arr, ld: int, tail: int = 0) -> Arr:
    """Store ``mat`` column-major with leading dimension ``ld``; padding holds ``FILL``."""
    rows, cols = mat.shape
    buf = np.full(ld * cols + tail, FILL, dtype=mat.dtype)
    buf[: ld * cols].reshape(cols, ld).T[:rows] = mat
    return buf


def lu_product(f: Arr, ipiv: Arr) -> Arr:
    """Rebuild A from getrf's packed L\\U and 1-based pivots: undo the swaps in reverse."""
    m, n = f.shape
    k = min(m, n)
    pa = (np.tril(f[:, :k], -1) + np.eye(m, k)) @ np.triu(f[:k, :])
    for i in reversed(range(k)):
        j = int(ipiv[i]) - 1
        pa[[i, j]] = pa[[j, i]]
    return pa
