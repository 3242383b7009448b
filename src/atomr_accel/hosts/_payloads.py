"""An op's bulk data on its way to a worker process: the slices of the shared arena it
crosses in, in place of pickled arrays.

``place`` reserves them (nothing is copied yet): an upload's source array, a
device function's large arrays (``_staged_arrays``) and a download's answer. The
process host then copies a payload in with ``Fill`` (on an executor thread when
large) and pickles the op, which now names the slices.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.core._op import Op
from atomr_accel.core.ops._function import CallFunction
from atomr_accel.core.ops._memory import Download, Upload
from atomr_accel.hosts._shm import SharedArena, ShmSlice, dtype_spec
from atomr_accel.hosts._staged_arrays import stage

__all__ = ["Fill", "Payloads", "place"]

Fill = Callable[[np.ndarray[Any, Any]], None]
"""Copies a request's payload into its staged slice of the arena (given as an array)."""


@dataclass(frozen=True, slots=True)
class Payloads:
    """``op`` as it crosses (its payloads replaced by arena slices), the slice its payload
    is copied into (``staged``, by ``fill``) and the one its answer comes back in
    (``out``)."""

    op: Op
    staged: ShmSlice | None = None
    out: ShmSlice | None = None
    fill: Fill | None = None


def place(arena: SharedArena, op: Op) -> Payloads:
    """Reserve the arena slices ``op``'s payloads cross in (an upload's NumPy source, a
    device function's large arrays, a download's answer); an op without any crosses as
    it is."""
    if isinstance(op, Upload) and isinstance(op.data, np.ndarray):
        data = op.data
        staged = arena.take(data.nbytes, dtype_spec(data.dtype))
        return Payloads(dataclasses.replace(op, data=staged), staged,
                        fill=functools.partial(_fill_flat, data))
    if isinstance(op, CallFunction) and isinstance(op.args.arrays, tuple) and op.args.arrays:
        arrays = op.args.arrays
        placed = stage(arena, arrays)
        return Payloads(dataclasses.replace(op, args=op.args.with_arrays(placed)), placed.piece,
                        fill=functools.partial(placed.fill, arrays=arrays))
    if isinstance(op, Download):
        dtype = op.ref.dtype.numpy
        return Payloads(op, out=arena.take(op.count * dtype.itemsize, dtype_spec(dtype)))
    return Payloads(op)


def _fill_flat(data: np.ndarray[Any, Any], region: np.ndarray[Any, Any]) -> None:
    """An upload's ``Fill``: its data, flattened."""
    region[:] = data.reshape(-1)
