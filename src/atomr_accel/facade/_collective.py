"""``Collective``: NCCL-style collectives over the devices of a world (``System.nccl_world``).

Each call takes one buffer per rank (lists, rank order = the devices' order)
and runs the collective on every rank; it returns once every rank has
finished. Arguments are checked before anything runs (``InvalidArgument``,
``DTypeMismatch``).

How the data moves: one ``RunCollective`` op per rank, all in flight together,
each ordered with the buffers' other users like any op (``_collective_run.py``);
the backend moves the data: NCCL on CUDA (NVLink, PCIe or the network, on the
device's ``nccl`` stream), shared memory on the CPU (every rank computes its
own result in NumPy).

Failure: the first rank that fails aborts the epoch at once (the world's abort
word: every other rank's collective aborts itself), the call raises, and the
world rebuilds its communicators on the members' current contexts; the next
call waits for that (within its own time-out) and runs. A rank whose context
died gets ``ContextPoisoned``, the others ``CollectiveAborted``; a call made
from the controller raises ``ContextPoisoned`` when any rank died, else
``CollectiveAborted``. No call waits longer than its ``timeout_secs``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef
from atomr_accel.backends._state import Lru
from atomr_accel.core._errors import DTypeMismatch, GpuRefStale, GpuRuntimeError, InvalidArgument
from atomr_accel.core.ops._collective import COLLECTIVE_DTYPES, CallKind, CollectiveCall, ReduceOp
from atomr_accel.device._world import GetWorldStats, WorldState, WorldStats
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._collective_run import Planned, WorldRun, raise_merged
from atomr_accel.facade._collective_views import (
    CollectiveGroup,
    CollectiveRank,
    Rendezvous,
    open_group,
)
from atomr_accel.facade._portal import Portal, blocking, in_blocking_call, on_asyncio

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Collective", "CollectiveGroup", "CollectiveRank"]

DEFAULT_TIMEOUT = 60.0
"""A collective's time-out when the call gives none and the system has no ``op_timeout``."""

_KEPT_PLANS = 256
"""How many plans a world keeps (the least recently used go first)."""


_REDUCE_OPS: dict[object, ReduceOp] = {m.value: m for m in ReduceOp}
"""Each reduction by its name (a member equals its name): found without a parse."""


def _reduce_op(op: object) -> ReduceOp:
    if type(op) is str or type(op) is ReduceOp:
        found = _REDUCE_OPS.get(op)
        if found is not None:
            return found
    try:
        return ReduceOp(str(op)) if isinstance(op, str) else ReduceOp(op)  # type: ignore[arg-type]
    except ValueError:
        choices = ", ".join(repr(m.value) for m in ReduceOp)
        raise InvalidArgument(f"op must be one of {choices}, got {op!r}") from None

class Collective:
    """The collectives of one communicator world over ``devices`` (rank i = ``devices[i]``).

    Every method has an ``_async`` twin and takes ``timeout_secs`` (None: the
    system's ``op_timeout``, or 60 s). ``group()`` fuses the calls made inside
    it into one launch; ``rank(i)`` is the view of one rank, for code that
    drives each rank from its own task.
    """

    def __init__(self, ref: ActorRef, state: WorldState, devices: tuple[Device, ...],
                 portal: Portal, op_timeout: float | None, system: str) -> None:
        self.ref = ref
        self._state = state
        self.devices = devices
        self._portal = portal
        self._op_timeout = op_timeout
        self._system = system
        self._run = WorldRun(ref, state, devices)
        self._plans: Lru[Planned] = Lru(_KEPT_PLANS)
        self._rendezvous = Rendezvous(self)

    # ------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The world's name."""
        return self._state.name

    @property
    def nranks(self) -> int:
        """How many ranks (devices) the world spans."""
        return len(self.devices)

    @property
    def epoch(self) -> int:
        """The current communicator generation (one more per rebuild)."""
        return self._state.epoch

    def rank(self, index: int) -> CollectiveRank:
        """The view of rank ``index``: the same collectives, each taking this rank's buffers;
        a call waits until every rank has made its matching call."""
        if not isinstance(index, int) or isinstance(index, bool) \
                or not 0 <= index < self.nranks:
            raise InvalidArgument(f"rank must be an int in [0, {self.nranks}), got {index!r}")
        return CollectiveRank(self, index)

    def stats_async(self, *, timeout_secs: float | None = 5.0
                    ) -> Coroutine[Any, Any, WorldStats]:
        """A ``WorldStats`` snapshot: status, epoch, rebuilds, calls and bytes per kind."""
        return self._portal.acall(self.ref.ask(GetWorldStats(), timeout=timeout_secs))

    stats = blocking(stats_async)

    # ------------------------------------------------------------ checking

    def _buffers(self, bufs: Any, name: str, optional: bool = False
                 ) -> list[GpuBuffer | None]:
        if not isinstance(bufs, Sequence) or isinstance(bufs, str | bytes):
            raise InvalidArgument(f"{name} must be a list of one buffer per rank, "
                                  f"got {type(bufs).__name__}")
        if len(bufs) != self.nranks:
            raise InvalidArgument(f"{name} holds {len(bufs)} buffers for {self.nranks} ranks")
        out: list[GpuBuffer | None] = []
        for rank, buf in enumerate(bufs):
            if buf is None and optional:
                out.append(None)
                continue
            if not isinstance(buf, GpuBuffer):
                raise InvalidArgument(f"{name}[{rank}] must be a GpuBuffer, "
                                      f"got {type(buf).__name__}")
            if buf.device is not self.devices[rank]:
                raise InvalidArgument(f"{name}[{rank}] is not a buffer of rank {rank}'s device "
                                      f"{self.devices[rank]!r}")
            if buf.is_stale():
                raise GpuRefStale(f"{name}[{rank}] {buf.ref!r}", buf.generation,
                                  buf.device.generation)
            if buf.ref.dtype not in COLLECTIVE_DTYPES:
                raise DTypeMismatch(
                    f"{name}[{rank}] holds {buf.ref.dtype.value}; collectives move "
                    f"{', '.join(d.value for d in COLLECTIVE_DTYPES)}")
            out.append(buf)
        return out

    def _plan(self, kind: CallKind, send: list[GpuBuffer | None],
              recv: list[GpuBuffer | None], count: int, op: ReduceOp = ReduceOp.SUM,
              root: int = 0) -> Planned:
        """The checked calls of one collective over checked buffers; the plan of a call
        repeated on the same buffers (a training loop's) is kept and taken again. Kept by
        the identities of the buffers' refs, which the plan holds (so no other ref takes
        one of them while it is kept), as a ref is slower to hash than its id."""
        key = (kind, tuple([None if b is None else id(b.ref) for b in send]),
               tuple([None if b is None else id(b.ref) for b in recv]), count, op, root)
        return self._plans.get(key, lambda: self._new_plan(kind, send, recv, count, op, root))

    def _new_plan(self, kind: CallKind, send: list[GpuBuffer | None],
                  recv: list[GpuBuffer | None], count: int, op: ReduceOp, root: int
                  ) -> Planned:
        present = [b for b in (*send, *recv) if b is not None]
        dtypes = {b.ref.dtype for b in present}
        if len(dtypes) > 1:
            raise DTypeMismatch(f"{kind.value} needs one dtype on every rank, got "
                                f"{', '.join(sorted(d.value for d in dtypes))}")
        step = tuple(
            CollectiveCall(kind, None if s is None else s.ref, None if r is None else r.ref,
                           count, op, root)
            for s, r in zip(send, recv, strict=True))
        for call in step:
            call.validate(self.nranks)
        itemsize = present[0].ref.dtype.itemsize
        sent = {CallKind.ALL_GATHER: count, CallKind.REDUCE_SCATTER: count * self.nranks,
                CallKind.ALL_TO_ALL: count * self.nranks}.get(kind, count)
        senders = 1 if kind is CallKind.BROADCAST else self.nranks
        return Planned(kind, step, sent * itemsize * senders)

    def _root(self, root: object, what: str = "root") -> int:
        if not isinstance(root, int) or isinstance(root, bool) \
                or not 0 <= root < self.nranks:
            raise InvalidArgument(f"{what} must be a rank in [0, {self.nranks}), got {root!r}")
        return root

    @staticmethod
    def _same_length(bufs: list[GpuBuffer | None], name: str) -> int:
        lengths = {len(b) for b in bufs if b is not None}
        if len(lengths) != 1:
            raise InvalidArgument(f"{name} buffers must all have one length, got "
                                  f"{sorted(lengths)}")
        return lengths.pop()

    # ------------------------------------------------------------ collectives

    def all_reduce_async(self, send: Sequence[GpuBuffer], recv: Sequence[GpuBuffer] | None = None,
                         op: str = "sum", *, timeout_secs: float | None = None,
                         ) -> Coroutine[Any, Any, None]:
        """Reduce ``send`` across the ranks (``op``: sum, prod, min, max, avg) into every
        rank's ``recv`` (in place, into ``send``, when ``recv`` is None)."""
        return self._submit(self._plan_all_reduce(send, recv, op), timeout_secs)

    def _plan_all_reduce(self, send: Any, recv: Any, op: Any) -> Planned:
        sends = self._buffers(send, "send")
        recvs = sends if recv is None else self._buffers(recv, "recv")
        count = self._same_length(sends, "send")
        return self._plan(CallKind.ALL_REDUCE, sends, recvs, count, _reduce_op(op))

    all_reduce = blocking(all_reduce_async)

    def broadcast_async(self, bufs: Sequence[GpuBuffer], root: int = 0, *,
                        timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Copy rank ``root``'s buffer into every other rank's (in place)."""
        return self._submit(self._plan_broadcast(bufs, root), timeout_secs)

    def _plan_broadcast(self, bufs: Any, root: Any) -> Planned:
        buffers = self._buffers(bufs, "bufs")
        count = self._same_length(buffers, "bufs")
        return self._plan(CallKind.BROADCAST, buffers, buffers, count, root=self._root(root))

    broadcast = blocking(broadcast_async)

    def reduce_async(self, send: Sequence[GpuBuffer], recv: Sequence[GpuBuffer | None],
                     root: int = 0, op: str = "sum", *, timeout_secs: float | None = None,
                     ) -> Coroutine[Any, Any, None]:
        """Reduce ``send`` across the ranks into ``recv[root]`` (other ranks' ``recv`` may
        be None and are left as they are)."""
        return self._submit(self._plan_reduce(send, recv, root, op), timeout_secs)

    def _plan_reduce(self, send: Any, recv: Any, root: Any, op: Any) -> Planned:
        sends = self._buffers(send, "send")
        root = self._root(root)
        if recv is None:
            raise InvalidArgument(f"recv[{root}] (the root's) must be a buffer")
        recvs = self._buffers(recv, "recv", optional=True)
        if recvs[root] is None:
            raise InvalidArgument(f"recv[{root}] (the root's) must be a buffer")
        count = self._same_length(sends, "send")
        return self._plan(CallKind.REDUCE, sends, recvs, count, _reduce_op(op), root)

    reduce = blocking(reduce_async)

    def all_gather_async(self, send: Sequence[GpuBuffer], recv: Sequence[GpuBuffer], *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Concatenate every rank's ``send`` (rank order) into every rank's ``recv``."""
        return self._submit(self._plan_all_gather(send, recv), timeout_secs)

    def _plan_all_gather(self, send: Any, recv: Any) -> Planned:
        sends = self._buffers(send, "send")
        recvs = self._buffers(recv, "recv")
        count = self._same_length(sends, "send")
        return self._plan(CallKind.ALL_GATHER, sends, recvs, count)

    all_gather = blocking(all_gather_async)

    def reduce_scatter_async(self, send: Sequence[GpuBuffer], recv: Sequence[GpuBuffer],
                             op: str = "sum", *, timeout_secs: float | None = None,
                             ) -> Coroutine[Any, Any, None]:
        """Reduce ``send`` across the ranks; rank i's ``recv`` gets block i of the result
        (``len(recv)`` elements a block)."""
        return self._submit(self._plan_reduce_scatter(send, recv, op), timeout_secs)

    def _plan_reduce_scatter(self, send: Any, recv: Any, op: Any) -> Planned:
        sends = self._buffers(send, "send")
        recvs = self._buffers(recv, "recv")
        count = self._same_length(recvs, "recv")
        return self._plan(CallKind.REDUCE_SCATTER, sends, recvs, count, _reduce_op(op))

    reduce_scatter = blocking(reduce_scatter_async)

    def all_to_all_async(self, send: Sequence[GpuBuffer], recv: Sequence[GpuBuffer], *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Block j of rank i's ``send`` goes to block i of rank j's ``recv`` (``nranks``
        equal blocks a buffer)."""
        return self._submit(self._plan_all_to_all(send, recv), timeout_secs)

    def _plan_all_to_all(self, send: Any, recv: Any) -> Planned:
        sends = self._buffers(send, "send")
        recvs = self._buffers(recv, "recv")
        length = self._same_length(sends, "send")
        if length % self.nranks:
            raise InvalidArgument(f"all_to_all needs send lengths divisible by {self.nranks}, "
                                  f"got {length}")
        return self._plan(CallKind.ALL_TO_ALL, sends, recvs, length // self.nranks)

    all_to_all = blocking(all_to_all_async)

    def send_recv_async(self, send: GpuBuffer, recv: GpuBuffer, src: int, dst: int, *,
                        timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Send ``send`` (a buffer of rank ``src``) to ``recv`` (of rank ``dst``): NCCL's
        ``send``/``recv`` pair, ``len(send)`` elements."""
        src, dst = self._root(src, "src"), self._root(dst, "dst")
        if src == dst:
            raise InvalidArgument("src and dst must be two different ranks")
        sends: list[Any] = [None] * self.nranks
        recvs: list[Any] = [None] * self.nranks
        sends[src], recvs[dst] = send, recv
        checked_send = self._buffers(sends, "send", optional=True)
        checked_recv = self._buffers(recvs, "recv", optional=True)
        count = len(send)
        if len(recv) < count:
            raise InvalidArgument(f"recv holds {len(recv)} elements, send {count}")
        if send.ref.dtype is not recv.ref.dtype:
            raise DTypeMismatch(f"send holds {send.ref.dtype.value}, recv "
                                f"{recv.ref.dtype.value}")
        calls = tuple(
            CollectiveCall(CallKind.SEND, send.ref, None, count, root=dst) if r == src else
            CollectiveCall(CallKind.RECV, None, recv.ref, count, root=src) if r == dst else
            None for r in range(self.nranks))
        del checked_send, checked_recv
        for call in calls:
            if call is not None:
                call.validate(self.nranks)
        planned = Planned(CallKind.SEND, calls, count * send.ref.dtype.itemsize)
        return self._submit(planned, timeout_secs)

    send_recv = blocking(send_recv_async)

    def group(self, *, timeout_secs: float | None = None) -> CollectiveGroup:
        """Fuse the collectives called inside ``with world.group():`` (or ``async with``)
        into one launch per rank (one NCCL group), run when it exits, within
        ``timeout_secs`` (None: the system's op time-out). The calls inside return at
        once; the exit raises what the group raised. NCCL may run a group's calls
        together: no call of a group may read what another one writes. A group holds
        only its own thread's (or task's) calls: other callers of the world go on."""
        self._timeout(timeout_secs)  # checked now, not at the exit
        return CollectiveGroup(self, timeout_secs)

    # ------------------------------------------------------------ running

    def _timeout(self, timeout_secs: float | None) -> float:
        timeout = timeout_secs if timeout_secs is not None else self._op_timeout
        if timeout is None:
            return DEFAULT_TIMEOUT
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise InvalidArgument(f"timeout_secs must be > 0 seconds, got {timeout!r}")
        return float(timeout)

    async def _submit(self, planned: Planned, timeout_secs: float | None) -> None:
        timeout = self._timeout(timeout_secs)
        group = open_group(self)
        if group is not None:
            group.append(planned)
            return
        await self._run_checked([planned], timeout)

    async def _run_checked(self, plans: list[Planned], timeout: float) -> None:
        """Run ``plans`` where the caller is while the world serves (a blocking caller's
        thread, an asyncio caller's loop), else on the system's loop; raise the merged
        error."""
        run = self._run
        errors: list[GpuRuntimeError | None] | None = None
        if in_blocking_call():
            errors = run.execute_here(plans, timeout)
        elif on_asyncio():
            errors = await run.execute_on_this_loop(plans, timeout)
        if errors is None:
            errors = await self._portal.acall(self.execute(plans, timeout))
        raise_merged(errors)

    async def execute(self, plans: list[Planned], timeout: float
                      ) -> list[GpuRuntimeError | None]:
        """Run ``plans`` (in order, as one launch per rank) on the system's loop;
        answer each rank's error (None where the rank succeeded)."""
        return await self._run.execute(plans, timeout)

    def __repr__(self) -> str:
        return (f"Collective(name={self.name!r}, nranks={self.nranks}, "
                f"backend={self._state.backend!r}, epoch={self.epoch})")
