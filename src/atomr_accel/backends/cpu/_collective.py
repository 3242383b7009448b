"""Collective ops on the CPU backend: no communicator, only the world's membership.

A CPU context cannot reach another context's arrays, so the CPU backend keeps
no communicator: ``CommInit`` records which world, epoch and rank this context
joined and ``CommAbort`` forgets it. The data of a collective among CPU
devices is moved by the facade (each rank's ``Download``, the reduction in
NumPy, each rank's ``Upload``); ``RunCollective`` is a CUDA op.
"""

from __future__ import annotations

from collections.abc import Callable

from atomr_accel.backends._base import Backend
from atomr_accel.backends._handlers import cpu
from atomr_accel.backends._state import per_backend
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._collective import CommAbort, CommInit, RunCollective

__all__ = ["worlds"]


worlds: Callable[[Backend], dict[int, tuple[int, int]]] = per_backend(dict)
"""``worlds(backend)``: world id -> ``(epoch, rank)`` of the worlds a context has joined."""


@cpu.handles(CommInit)
def _init(backend: Backend, op: CommInit) -> None:
    worlds(backend)[op.world] = (op.epoch, op.rank)


@cpu.handles(CommAbort)
def _abort(backend: Backend, op: CommAbort) -> None:
    worlds(backend).pop(op.world, None)


@cpu.handles(RunCollective)
def _run(backend: Backend, op: RunCollective) -> None:
    raise InvalidArgument("RunCollective runs on CUDA devices; the CPU backend's collectives "
                          "are moved by Collective (System.nccl_world)")
