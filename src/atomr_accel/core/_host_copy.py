"""Host memory copies split over threads: NumPy copies without the interpreter lock, so a
large copy into page-locked memory runs at several threads' bandwidth.

Used where a large pageable array is staged through page-locked memory on its way to a
GPU: a CUDA context's upload slots, and a ``TorchModule`` replica's batches."""

from __future__ import annotations

import concurrent.futures
import functools
from typing import Any

import numpy as np

__all__ = ["COPY_THREADS", "copy_in_threads"]

COPY_THREADS = 4
"""Threads that share one copy."""


@functools.cache
def _pool() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(COPY_THREADS * 2,
                                                 thread_name_prefix="atomr-copy")


def copy_in_threads(target: np.ndarray[Any, Any], source: np.ndarray[Any, Any]) -> None:
    """``target[:] = source`` for two 1-D byte arrays of one length, split over
    ``COPY_THREADS`` threads (this one among them)."""
    step = -(-source.nbytes // COPY_THREADS)
    parts = [_pool().submit(np.copyto, target[a:a + step], source[a:a + step])
             for a in range(step, source.nbytes, step)]
    np.copyto(target[:step], source[:step])
    for part in parts:
        part.result()
