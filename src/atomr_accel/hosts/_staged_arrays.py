"""A device function's large host arrays on their way to a worker process: copied once
into one slice of the shared arena, beside the op's pickle, never pickled themselves.

The process host puts a ``StagedArrays`` in place of the arrays of the op's ``Packed``
(``stage``); the worker puts views of the arena back (``views``), which the
function's handler copies into the context before the op is answered, so that the
slice can be given back with the answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from atomr_accel.hosts._shm import SharedArena, ShmSlice, dtype_spec

__all__ = ["StagedArrays", "stage"]

_ALIGN = 64


@dataclass(frozen=True, slots=True)
class StagedArrays:
    """Where each array lies in ``piece`` (bytes): its offset, ``dtype_spec``, shape and
    order (``"F"`` for an array in Fortran order, ``"C"`` for any other)."""

    piece: ShmSlice
    places: tuple[tuple[int, str, tuple[int, ...], Literal["C", "F"]], ...]

    def views(self, region: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], ...]:
        """The arrays as views of ``region`` (the slice's bytes, mapped in this process)."""
        out = []
        for offset, spec, shape, order in self.places:
            dtype = np.dtype(spec)
            chunk = region[offset:offset + math.prod(shape) * dtype.itemsize]
            out.append(chunk.view(dtype).reshape(shape, order=order))
        return tuple(out)

    def fill(self, region: np.ndarray[Any, Any], arrays: Sequence[np.ndarray[Any, Any]]) -> None:
        """Copy ``arrays`` into their places in ``region``."""
        for view, array in zip(self.views(region), arrays, strict=True):
            np.copyto(view, array, casting="no")


def stage(arena: SharedArena, arrays: Sequence[np.ndarray[Any, Any]]) -> StagedArrays:
    """Reserve one slice of ``arena`` for ``arrays`` (nothing is copied yet: ``fill``)."""
    places = []
    offset = 0
    for array in arrays:
        flags = array.flags
        order: Literal["C", "F"] = "F" if flags.f_contiguous and not flags.c_contiguous else "C"
        places.append((offset, dtype_spec(array.dtype), tuple(array.shape), order))
        offset += -(-array.nbytes // _ALIGN) * _ALIGN
    return StagedArrays(arena.take(offset, "|u1"), tuple(places))
