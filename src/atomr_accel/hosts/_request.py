"""The process host's record of one op on its way to the worker (``Request``).

It says what was staged in shared memory for the op, how the op travels (its
pickled payload in the ring, or spilled to a segment of its own) and where its
answer goes: to a ``done`` callback by a frame, or into a reply slot.
"""

from __future__ import annotations

import dataclasses

from atomr_accel.core._op import Op
from atomr_accel.hosts._base import Done, Ticket
from atomr_accel.hosts._channel import NO_SLOT, Spilled
from atomr_accel.hosts._shm import ShmSlice

__all__ = ["Request"]


@dataclasses.dataclass(slots=True, eq=False)
class Request:
    """One op on its way to the worker, and where its answer goes."""

    op: Op
    stream: int
    ticket: Ticket
    done: Done | None  # None: a blocking caller waits on ``slot``
    staged: ShmSlice | None
    out: ShmSlice | None
    slot: int = NO_SLOT
    payload: bytes | None = None  # the pickled request, once its upload is staged
    spilled: Spilled | None = None  # where a payload too large for the ring lies
    error: BaseException | None = None  # staging failed: answer this instead
    id: int = 0  # set when it enters the ring
    end: int = 0  # where its record ends in the ring: the worker took it once tail >= end
