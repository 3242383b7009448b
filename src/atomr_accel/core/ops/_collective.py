"""Collective ops: one rank's part of an NCCL communicator world (library ``"nccl"``).

A world of ``n`` devices runs each collective as one op per rank, all in flight
together: ``CommInit`` joins this device to a new communicator (NCCL's
``ncclCommInitRank`` with the unique id every rank shares), ``RunCollective``
launches one or more ``CollectiveCall``s as one NCCL group on the op's stream
(ordered with the buffers' other users like any op), and ``CommAbort`` drops
the communicator with ``ncclCommAbort`` (never a blocking destroy). The CPU
backend has no NCCL: its ranks exchange their data through shared memory beside
the world's abort word (see ``backends/cpu/_collective.py``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import Op, is_int, require_nonneg
from atomr_accel.core._ref import GpuRef

__all__ = [
    "COLLECTIVE_DTYPES",
    "CallKind",
    "CollectiveCall",
    "CommAbort",
    "CommInit",
    "ReduceOp",
    "RunCollective",
]

declare("nccl", "Collective",
        "NCCL: this device's communicators (one per world) and the collectives run on them.",
        rank=14, sequenced=False)

COLLECTIVE_DTYPES: tuple[DType, ...] = (
    DType.F16, DType.BF16, DType.F32, DType.F64, DType.I8, DType.U8, DType.I32, DType.U32,
    DType.I64, DType.U64,
)
"""The dtypes NCCL reduces and moves."""


class ReduceOp(enum.StrEnum):
    """How a reducing collective combines the ranks' values."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    """The sum divided by the number of ranks (NCCL's ``ncclAvg``; floats truncate toward
    zero for integer dtypes, as NCCL does)."""


class CallKind(enum.StrEnum):
    """Which collective a ``CollectiveCall`` is."""

    ALL_REDUCE = "all_reduce"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class CollectiveCall(PickleByFields):
    """One rank's part of one collective: ``count`` elements per rank.

    ``count`` is what NCCL calls the count: the elements each rank sends for
    ``all_reduce``/``broadcast``/``reduce``/``all_gather`` (``recv`` holds
    ``count * nranks`` for ``all_gather``), the elements each rank receives for
    ``reduce_scatter`` (``send`` holds ``count * nranks``), the elements per
    peer for ``all_to_all``. ``root`` is the root rank (broadcast, reduce) or
    the peer (send, recv). ``send`` may be None where this rank sends nothing
    (``recv``), ``recv`` where it receives nothing (``send``; a non-root rank
    of ``reduce`` passes its send buffer again).
    """

    kind: CallKind
    send: GpuRef | None
    recv: GpuRef | None
    count: int
    op: ReduceOp = ReduceOp.SUM
    root: int = 0

    @property
    def dtype(self) -> DType:
        """The dtype the call moves."""
        ref = self.send if self.send is not None else self.recv
        assert ref is not None
        return ref.dtype

    def validate(self, nranks: int) -> None:
        """Check the call's buffers against ``nranks`` (``InvalidArgument``)."""
        if not isinstance(self.kind, CallKind):  # (no message built on the common path)
            raise InvalidArgument(f"kind must be a CallKind, got {self.kind!r}")
        if not isinstance(self.op, ReduceOp):
            raise InvalidArgument(f"op must be a ReduceOp, got {self.op!r}")
        require_nonneg(count=self.count, root=self.root)
        if self.root >= nranks:
            raise InvalidArgument(f"root/peer {self.root} is not a rank of {nranks}")
        for name in ("send", "recv"):
            ref = getattr(self, name)
            if ref is not None and not isinstance(ref, GpuRef):
                raise InvalidArgument(f"{name} must be a GpuRef or None, got {ref!r}")
        if self.send is None and self.recv is None:
            raise InvalidArgument("a collective call needs a send or a recv buffer")
        if self.send is not None and self.recv is not None \
                and self.send.dtype is not self.recv.dtype:
            raise InvalidArgument(f"send holds {self.send.dtype.value} but recv holds "
                                  f"{self.recv.dtype.value}")
        if self.dtype not in COLLECTIVE_DTYPES:
            raise InvalidArgument(f"NCCL does not move {self.dtype.value}; use one of "
                                  f"{', '.join(d.value for d in COLLECTIVE_DTYPES)}")
        if self.kind in _OUT_OF_PLACE and self.send == self.recv:
            raise InvalidArgument(f"{self.kind.value} needs distinct send and recv buffers")
        send_len, recv_len = _lengths(self.kind, self.count, nranks)
        for name, needed in (("send", send_len), ("recv", recv_len)):
            ref = getattr(self, name)
            if ref is not None and needed and ref.length < needed:
                raise InvalidArgument(f"{self.kind.value} needs {name} of at least {needed} "
                                      f"elements, got {ref.length}")


_OUT_OF_PLACE = frozenset({CallKind.ALL_GATHER, CallKind.REDUCE_SCATTER, CallKind.ALL_TO_ALL})
"""Collectives whose recv buffer cannot be their send buffer."""


def _lengths(kind: CallKind, count: int, nranks: int) -> tuple[int, int]:
    """The elements ``send`` and ``recv`` must hold for ``kind`` of ``count`` (0: unused)."""
    if kind is CallKind.ALL_GATHER:
        return count, count * nranks
    if kind in (CallKind.REDUCE_SCATTER,):
        return count * nranks, count
    if kind is CallKind.ALL_TO_ALL:
        return count * nranks, count * nranks
    if kind is CallKind.SEND:
        return count, 0
    if kind is CallKind.RECV:
        return 0, count
    return count, count


def _require_world(world: int, rank: int | None = None, nranks: int | None = None) -> None:
    if not is_int(world) or world < 1:
        raise InvalidArgument(f"world must be an int >= 1, got {world!r}")
    if nranks is not None:
        if not is_int(nranks) or nranks < 1:
            raise InvalidArgument(f"nranks must be an int >= 1, got {nranks!r}")
        if not is_int(rank) or not 0 <= rank < nranks:
            raise InvalidArgument(f"rank must be an int in [0, {nranks}), got {rank!r}")


@dataclass(frozen=True, slots=True)
class CommInit(Op):
    """Join communicator ``epoch`` of world ``world`` as rank ``rank`` of ``nranks``.

    Every rank's ``CommInit`` must be in flight together: NCCL's init waits for
    all of them. ``unique_id`` is NCCL's unique id (made once by the world, in
    the parent process, and sent to every rank); ``abort_path`` names the
    world's shared abort word (a file of 8 bytes): a collective of this
    communicator aborts itself once that word no longer holds ``epoch``. A
    communicator this device held for ``world`` before is aborted first.
    """

    library: ClassVar[str] = "nccl"
    world: int
    epoch: int
    nranks: int
    rank: int
    unique_id: bytes = b""
    abort_path: str = ""

    def validate(self) -> None:
        _require_world(self.world, self.rank, self.nranks)
        require_nonneg(epoch=self.epoch)
        if not isinstance(self.unique_id, bytes):
            raise InvalidArgument(f"unique_id must be bytes, got {type(self.unique_id)}")


@dataclass(frozen=True, slots=True)
class CommAbort(Op):
    """Abort and drop this device's communicator of world ``world`` (``ncclCommAbort``);
    nothing to do when it holds none."""

    library: ClassVar[str] = "nccl"
    world: int

    def validate(self) -> None:
        _require_world(self.world)


@dataclass(frozen=True, slots=True)
class RunCollective(Op):
    """Run ``calls`` on this rank's communicator of world ``world`` as one NCCL group.

    The op reads every send buffer and writes every recv buffer, so it waits
    for their earlier users on other streams and later users wait for it. It
    answers once the group has finished on this rank; past ``timeout`` seconds,
    or once the world's abort word leaves ``epoch``, it aborts the communicator
    and raises ``CollectiveAborted`` instead (a collective never hangs).
    """

    library: ClassVar[str] = "nccl"
    world: int
    epoch: int
    nranks: int
    calls: tuple[CollectiveCall, ...]
    timeout: float = 60.0

    def refs(self) -> tuple[GpuRef, ...]:
        """Every send and recv buffer of the calls."""
        if len(self.calls) == 1:  # the common case, without the general dedup
            send, recv = self.calls[0].send, self.calls[0].recv
            if recv is None or recv is send:
                return () if send is None else (send,)
            return (recv,) if send is None or send == recv else (send, recv)
        refs: list[GpuRef] = []
        for call in self.calls:
            refs.extend(r for r in (call.send, call.recv) if r is not None and r not in refs)
        return tuple(refs)

    def writes(self) -> tuple[GpuRef, ...]:
        """The recv buffers of the calls."""
        if len(self.calls) == 1:
            recv = self.calls[0].recv
            return () if recv is None else (recv,)
        return tuple({c.recv: None for c in self.calls if c.recv is not None})

    def validate(self) -> None:
        _require_world(self.world)
        require_nonneg(epoch=self.epoch)
        if not is_int(self.nranks) or self.nranks < 1:
            raise InvalidArgument(f"nranks must be an int >= 1, got {self.nranks!r}")
        if not isinstance(self.calls, tuple) or not self.calls:
            raise InvalidArgument("calls must be a non-empty tuple of CollectiveCall")
        for call in self.calls:
            if not isinstance(call, CollectiveCall):
                raise InvalidArgument(f"calls holds {call!r}, not a CollectiveCall")
            call.validate(self.nranks)
        if not isinstance(self.timeout, int | float) or not self.timeout > 0:
            raise InvalidArgument(f"timeout must be > 0 seconds, got {self.timeout!r}")
