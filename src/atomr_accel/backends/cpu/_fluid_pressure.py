"""The fluid's pressure solve on the CPU backend: the reference of the CUDA kernels.

The projection solves ``A p = -div`` for the pressure, ``A`` the cell-centred 5-point
Laplacian of a closed box (a cell's diagonal counts its in-grid neighbours; constants are
its null space), by conjugate gradients preconditioned with one multigrid V-cycle:

* Level ``l + 1`` merges 2 x 2 cells of level ``l`` (``pressure_levels``). Its operator is
  the Galerkin product of piecewise-constant aggregation: the face between two blocks
  weighs the number of finest-grid faces it stands for, the rows (or columns) the blocks
  span, ``min(2**l, h0 - j * 2**l)``; nothing is stored.
* A level smooths once with damped Jacobi (``OMEGA``) from zero, restricts its residual by
  summing each block's cells, takes the coarser level's answer back to every cell of the
  block times ``COARSE_SCALE`` (the over-correction aggregation needs), and smooths once
  more. The coarsest level (at most 16 cells) runs ``COARSE_SWEEPS`` Jacobi sweeps. The
  V-cycle is a fixed symmetric linear map, as conjugate gradients needs.
* Vectors are float32, dot products float64. The iteration stops once
  ``max|r| <= tolerance * max|u, v|`` (the face velocities before the projection; ``r``
  is the divergence the projection leaves) or after ``iterations`` iterations.

The CUDA kernels (``backends.cuda._fluid_pressure``) run the same algorithm, so the two
backends agree to float32 rounding (dot products sum in another order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from atomr_accel.core.ops._realtime_physics import pressure_levels

__all__ = ["COARSE_SCALE", "COARSE_SWEEPS", "OMEGA", "solve_pressure"]

F32 = np.float32
Array = np.ndarray[Any, Any]
OMEGA = 0.8
"""The damping of the multigrid's Jacobi sweeps."""
COARSE_SCALE = 1.6
"""The factor on the coarse-grid correction (plain aggregation under-corrects)."""
COARSE_SWEEPS = 16
"""Jacobi sweeps on the coarsest level."""


class _Level:
    """One grid of the V-cycle: its face weights and diagonal."""

    def __init__(self, width: int, height: int, span: int, w0: int, h0: int) -> None:
        rows = np.minimum(span, h0 - np.arange(height) * span).astype(F32)
        cols = np.minimum(span, w0 - np.arange(width) * span).astype(F32)
        self.wx = np.repeat(rows[:, None], width - 1, axis=1)  # faces between x and x + 1
        self.wy = np.repeat(cols[None, :], height - 1, axis=0)  # between y and y + 1
        diag = np.zeros((height, width), F32)
        diag[:, 1:] += self.wx
        diag[:, :-1] += self.wx
        diag[1:, :] += self.wy
        diag[:-1, :] += self.wy
        self.diag = np.where(diag > 0, diag, F32(1))  # a 1 x 1 level has no faces

    def apply(self, x: Array) -> Array:
        """``A x`` on this level."""
        y: Array = self.diag * x
        y[:, 1:] -= self.wx * x[:, :-1]
        y[:, :-1] -= self.wx * x[:, 1:]
        y[1:, :] -= self.wy * x[:-1, :]
        y[:-1, :] -= self.wy * x[1:, :]
        return y

    def sweep(self, x: Array, b: Array) -> Array:
        """One damped Jacobi sweep of ``A x = b``."""
        out: Array = (x + F32(OMEGA) * (b - self.apply(x)) / self.diag).astype(F32)
        return out


def _restrict(r: Array) -> Array:
    """Sum each 2 x 2 block (a last odd row or column alone)."""
    h, w = r.shape
    out = np.zeros(((h + 1) // 2, (w + 1) // 2), F32)
    out[:, :] += r[0::2, 0::2]
    out[: h // 2, :] += r[1::2, 0::2]
    out[:, : w // 2] += r[0::2, 1::2]
    out[: h // 2, : w // 2] += r[1::2, 1::2]
    return out


def _prolong(e: Array, shape: tuple[int, ...]) -> Array:
    """Each block's value to each of its cells."""
    out: Array = np.repeat(np.repeat(e, 2, axis=0), 2, axis=1)[: shape[0], : shape[1]]
    return out


def _vcycle(levels: list[_Level], b: Array, index: int = 0) -> Array:
    """One V-cycle from zero: an approximation of ``A^-1 b`` on level ``index``."""
    level = levels[index]
    if index == len(levels) - 1:
        x = np.zeros_like(b)
        for _ in range(COARSE_SWEEPS):
            x = level.sweep(x, b)
        return x
    x = (F32(OMEGA) * b / level.diag).astype(F32)
    coarse = _vcycle(levels, _restrict((b - level.apply(x)).astype(F32)), index + 1)
    x = (x + F32(COARSE_SCALE) * _prolong(coarse, b.shape)).astype(F32)
    return level.sweep(x, b)


def _dot(a: Array, b: Array) -> float:
    return float(np.dot(a.ravel().astype(np.float64), b.ravel().astype(np.float64)))


def solve_pressure(p: Array, div: Array, scale: float, tolerance: float,
                   iterations: int) -> tuple[Array, int]:
    """The pressure that leaves at most ``tolerance * scale`` divergence, from ``p``; and
    the iterations it took (see the module docstring)."""
    h, w = div.shape
    levels = [_Level(lw, lh, 1 << i, w, h) for i, (lw, lh) in enumerate(pressure_levels(w, h))]
    fine = levels[0]
    x = p.astype(F32)
    r = (-div - fine.apply(x)).astype(F32)
    limit = F32(tolerance) * F32(scale)
    direction = q = np.zeros_like(r)
    rz_old = 0.0
    done = 0
    while done < iterations and not float(np.abs(r).max()) <= limit:
        z = _vcycle(levels, r)
        rz = _dot(r, z)
        beta = F32(rz / rz_old) if done > 0 and rz_old != 0 else F32(0)
        direction = (z + beta * direction).astype(F32)
        q = (fine.apply(z) + beta * q).astype(F32)  # A direction, without another pass
        pq = _dot(direction, q)
        alpha = F32(rz / pq) if pq != 0 else F32(0)
        x = (x + alpha * direction).astype(F32)
        r = (r - alpha * q).astype(F32)
        rz_old = rz
        done += 1
    return x, done
