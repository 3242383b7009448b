"""``Collective``: NCCL-style collectives over the devices of a world (``System.nccl_world``).

Each call takes one buffer per rank (lists, rank order = the devices' order)
and runs the collective on every rank; it returns once every rank has
finished. Arguments are checked before anything runs (``InvalidArgument``,
``DTypeMismatch``).

How the data moves:

One ``RunCollective`` op per rank, all in flight together, each ordered with
the buffers' other users like any op; the backend moves the data: NCCL on CUDA
(NVLink, PCIe or the network, on the device's ``nccl`` stream), shared memory
on the CPU (every rank computes its own result in NumPy).

Failure: the first rank that fails aborts the epoch at once (the world's abort
word: every other rank's collective aborts itself), the call raises, and the
world rebuilds its communicators on the members' current contexts; the next
call waits for that (within its own time-out) and runs. A rank whose context
died gets ``ContextPoisoned``, the others ``CollectiveAborted``; a call made
from the controller raises ``ContextPoisoned`` when any rank died, else
``CollectiveAborted``. No call waits longer than its ``timeout_secs``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import ActorRef
from atomr_accel.core._errors import (
    CollectiveAborted,
    ContextPoisoned,
    DTypeMismatch,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
)
from atomr_accel.core.ops._collective import (
    COLLECTIVE_DTYPES,
    CallKind,
    CollectiveCall,
    ReduceOp,
    RunCollective,
)
from atomr_accel.device._state import Status
from atomr_accel.device._world import GetWorldStats, WorldBroken, WorldState, WorldStats
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._portal import Portal, blocking

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device

__all__ = ["Collective", "CollectiveRank"]

DEFAULT_TIMEOUT = 60.0
"""A collective's time-out when the call gives none and the system has no ``op_timeout``."""

WATCH_SECONDS = 0.01
"""How often a collective in flight looks whether a member's context went down."""

Step = tuple[CollectiveCall | None, ...]
"""One collective: one call per rank, in rank order (None: the rank takes no part)."""


def _reduce_op(op: object) -> ReduceOp:
    try:
        return ReduceOp(str(op)) if isinstance(op, str) else ReduceOp(op)  # type: ignore[arg-type]
    except ValueError:
        choices = ", ".join(repr(m.value) for m in ReduceOp)
        raise InvalidArgument(f"op must be one of {choices}, got {op!r}") from None


@dataclass(frozen=True, slots=True)
class _Planned:
    """A collective checked and ready to run: its calls per rank and what it moves."""

    kind: CallKind
    step: Step
    nbytes: int


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
        self._group: list[_Planned] | None = None
        self._rendezvous = _Rendezvous(self)

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
              root: int = 0) -> _Planned:
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
        return _Planned(kind, step, sent * itemsize * senders)

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

    def _plan_all_reduce(self, send: Any, recv: Any, op: Any) -> _Planned:
        sends = self._buffers(send, "send")
        recvs = sends if recv is None else self._buffers(recv, "recv")
        count = self._same_length(sends, "send")
        return self._plan(CallKind.ALL_REDUCE, sends, recvs, count, _reduce_op(op))

    all_reduce = blocking(all_reduce_async)

    def broadcast_async(self, bufs: Sequence[GpuBuffer], root: int = 0, *,
                        timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """Copy rank ``root``'s buffer into every other rank's (in place)."""
        return self._submit(self._plan_broadcast(bufs, root), timeout_secs)

    def _plan_broadcast(self, bufs: Any, root: Any) -> _Planned:
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

    def _plan_reduce(self, send: Any, recv: Any, root: Any, op: Any) -> _Planned:
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

    def _plan_all_gather(self, send: Any, recv: Any) -> _Planned:
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

    def _plan_reduce_scatter(self, send: Any, recv: Any, op: Any) -> _Planned:
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

    def _plan_all_to_all(self, send: Any, recv: Any) -> _Planned:
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
        planned = _Planned(CallKind.SEND, calls, count * send.ref.dtype.itemsize)
        return self._submit(planned, timeout_secs)

    send_recv = blocking(send_recv_async)

    def group(self, *, timeout_secs: float | None = None) -> CollectiveGroup:
        """Fuse the collectives called inside ``with world.group():`` (or ``async with``)
        into one launch per rank (one NCCL group), run when it exits, within
        ``timeout_secs`` (None: the system's op time-out). The calls inside return at
        once; the exit raises what the group raised. NCCL may run a group's calls
        together: no call of a group may read what another one writes."""
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

    async def _submit(self, planned: _Planned, timeout_secs: float | None) -> None:
        timeout = self._timeout(timeout_secs)
        if self._group is not None:
            self._group.append(planned)
            return
        await self._portal.acall(self._run_checked([planned], timeout))

    async def _run_checked(self, plans: list[_Planned], timeout: float) -> None:
        errors = await self.execute(plans, timeout)
        raise_merged(errors)

    async def execute(self, plans: list[_Planned], timeout: float
                      ) -> list[GpuRuntimeError | None]:
        """Run ``plans`` (in order, as one launch per rank) on the system's loop;
        answer each rank's error (None where the rank succeeded)."""
        state = self._state
        deadline = time.perf_counter() + timeout
        try:
            await self._ready(deadline)
        except GpuRuntimeError as exc:
            return [exc] * self.nranks
        epoch = state.epoch
        generations = [d.generation for d in self.devices]
        left = max(deadline - time.perf_counter(), 1e-3)
        errors = await self._run_ranks(plans, epoch, left)
        if not any(errors):
            for planned in plans:
                state.count(planned.kind.value, planned.nbytes)
            return errors
        state.aborted += 1
        state.abort(epoch)
        self.ref.tell(WorldBroken(epoch, _why(errors)))
        return _per_rank(errors, [d.generation != g for d, g in zip(self.devices, generations,
                                                                    strict=True)])

    async def _ready(self, deadline: float) -> None:
        state = self._state
        while True:
            if state.error is not None:
                raise state.error
            if state.status == "ready" and not state.changed():
                return
            ready = state.ready
            left = deadline - time.perf_counter()
            if left <= 0:
                raise CollectiveAborted(f"world {state.name} was not ready within the "
                                        "collective's time-out (rebuilding its communicators)")
            if ready is None:  # the world's actor has not started yet
                await asyncio.sleep(min(left, 0.001))
                continue
            try:
                async with asyncio.timeout(left):
                    await asyncio.shield(ready)
            except TimeoutError:
                continue
            except GpuRuntimeError:
                continue
            if state.status == "ready" and state.changed():
                await asyncio.sleep(0.001)  # a member changed: the world rebuilds

    async def _first_failure(self, coros: list[Coroutine[Any, Any, Any]], epoch: int,
                             timeout: float) -> list[Any]:
        """Run one coroutine per rank; the first error aborts the epoch at once (the others
        then abort themselves); past ``timeout`` the unfinished ones are cancelled."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            await self._watch(tasks, epoch, timeout)
        except BaseException:  # the caller was cancelled: the ranks' calls finish unwatched
            for task in tasks:
                task.add_done_callback(_consume)
            raise
        results: list[Any] = []
        for task in tasks:
            if task.cancelled() or not task.done():
                results.append(CollectiveAborted(
                    f"collective of world {self._state.name} did not finish within its "
                    f"time-out of {timeout:g} s"))
            else:
                error = task.exception()
                results.append(task.result() if error is None else error)
        return results

    async def _watch(self, tasks: list[asyncio.Task[Any]], epoch: int, timeout: float) -> None:
        """Wait for the ranks' ``tasks`` (see ``_first_failure``); cancel those unfinished
        past ``timeout``."""
        deadline = time.perf_counter() + timeout
        members = self._state.members
        generations = [m.generation for m in members]
        pending: set[asyncio.Task[Any]] = set(tasks)
        while pending:  # until done, the first error, a member's context going down, or time
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=min(left, WATCH_SECONDS),
                                            return_when=asyncio.FIRST_EXCEPTION)
            if any(t.done() and not t.cancelled() and t.exception() is not None
                   for t in tasks) or any(m.generation != g or m.status is not Status.READY
                                          for m, g in zip(members, generations, strict=True)):
                break
        if pending:
            self._state.abort(epoch)  # every rank's collective of the epoch aborts itself
            left = max(deadline - time.perf_counter(), 0.0)
            if left:
                _, pending = await asyncio.wait(pending, timeout=left)
            for task in pending:
                task.cancel()

    async def _run_ranks(self, plans: list[_Planned], epoch: int, timeout: float
                        ) -> list[GpuRuntimeError | None]:
        state = self._state
        coros = []
        for rank, device in enumerate(self.devices):
            calls = tuple(c for p in plans if (c := p.step[rank]) is not None)
            if not calls:
                continue
            op = RunCollective(state.id, epoch, self.nranks, calls, timeout)
            coros.append(device.run_async(op, timeout + 5.0))
        return _typed(await self._first_failure(coros, epoch, timeout))

    def __repr__(self) -> str:
        return (f"Collective(name={self.name!r}, nranks={self.nranks}, "
                f"backend={self._state.backend!r}, epoch={self.epoch})")


def _typed(results: list[Any]) -> list[GpuRuntimeError | None]:
    out: list[GpuRuntimeError | None] = []
    for value in results:
        if value is None or isinstance(value, GpuRuntimeError):
            out.append(value)
        elif isinstance(value, BaseException):
            error = CollectiveAborted(f"the collective failed: {value!r}")
            error.__cause__ = value
            out.append(error)
        else:
            out.append(None)
    return out


def _why(errors: list[GpuRuntimeError | None]) -> str:
    for rank, error in enumerate(errors):
        if error is not None:
            return f"rank {rank} failed: {error}"
    return ""


def _per_rank(errors: list[GpuRuntimeError | None], died: list[bool]
              ) -> list[GpuRuntimeError | None]:
    """Each rank's error: ``ContextPoisoned`` where its context died, the request's own
    error where it was refused for itself (a bad argument), ``CollectiveAborted`` else."""
    cause = next(e for e in errors if e is not None)
    out: list[GpuRuntimeError | None] = []
    for rank, error in enumerate(errors):
        if died[rank] or isinstance(error, ContextPoisoned):
            if isinstance(error, ContextPoisoned):
                out.append(error)
            else:
                dead = ContextPoisoned(f"rank {rank}'s context went down during the collective")
                dead.__cause__ = error
                out.append(dead)
        elif error is not None and not isinstance(error, CollectiveAborted | GpuRefStale) \
                and isinstance(error, InvalidArgument):
            out.append(error)
        else:
            aborted = error if isinstance(error, CollectiveAborted) else CollectiveAborted(
                f"rank {rank}'s collective was aborted: {_why(errors)}")
            if aborted is not error:
                aborted.__cause__ = error or cause
            out.append(aborted)
    return out


def raise_merged(errors: list[GpuRuntimeError | None]) -> None:
    """Raise the controller's error of a collective: ``ContextPoisoned`` if a rank's context
    died, else the first rank's error; nothing when every rank succeeded."""
    failed = [e for e in errors if e is not None]
    if not failed:
        return
    dead = [e for e in failed if isinstance(e, ContextPoisoned)]
    raise dead[0] if dead else failed[0]


def _consume(task: asyncio.Future[Any]) -> None:
    """Mark a rank's call as heard: its caller is gone (cancelled), so nobody can take its
    error; a member whose context went down is seen by the world's next call, which waits
    for the communicators to be rebuilt (``WorldState.changed``)."""
    if not task.cancelled():
        task.exception()


class CollectiveGroup:
    """``with world.group():`` / ``async with world.group():``: the collectives called
    inside run as one launch per rank when it exits (see ``Collective.group``)."""

    def __init__(self, world: Collective, timeout_secs: float | None = None) -> None:
        self._world = world
        self._timeout = timeout_secs

    def _enter(self) -> None:
        if self._world._group is not None:
            raise InvalidArgument("groups do not nest")
        self._world._group = []

    def _take(self) -> list[_Planned]:
        plans, self._world._group = self._world._group or [], None
        return plans

    def __enter__(self) -> CollectiveGroup:
        self._enter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        plans = self._take()
        if exc_type is None and plans:
            world = self._world
            world._portal.call(world._run_checked(plans, world._timeout(self._timeout)))

    async def __aenter__(self) -> CollectiveGroup:
        self._enter()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        plans = self._take()
        if exc_type is None and plans:
            world = self._world
            await world._portal.acall(world._run_checked(plans, world._timeout(self._timeout)))


class _Slot:
    """The k-th collective of every rank of a rank-view rendezvous."""

    def __init__(self, n: int, loop: asyncio.AbstractEventLoop) -> None:
        self.parts: dict[int, tuple[str, tuple[Any, ...], dict[str, Any]]] = {}
        self.answers: list[asyncio.Future[None]] = [loop.create_future() for _ in range(n)]
        self.failed: GpuRuntimeError | None = None


class _Rendezvous:
    """Matches the k-th call of every rank view into one collective, runs it, answers each
    rank with its own error (or success)."""

    def __init__(self, world: Collective) -> None:
        self._world = world
        self._next = [0] * world.nranks
        self._slots: dict[int, _Slot] = {}

    async def join(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   timeout: float) -> None:
        world = self._world
        index = self._next[rank]
        self._next[rank] += 1
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = _Slot(world.nranks, asyncio.get_running_loop())
        if slot.failed is not None:
            raise slot.failed
        slot.parts[rank] = (method, args, kwargs)
        if len(slot.parts) == world.nranks:
            del self._slots[index]
            asyncio.get_running_loop().create_task(self._run(slot, timeout))
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(slot.answers[rank])
        except TimeoutError:
            if self._slots.get(index) is slot:  # the others never came: this slot is spent
                slot.failed = CollectiveAborted(
                    f"collective {index} of world {world.name}: not every rank joined within "
                    f"{timeout:g} s")
                for answer in slot.answers:
                    if not answer.done():
                        answer.set_exception(slot.failed)
                        answer.exception()
            raise CollectiveAborted(f"rank {rank}'s collective {index} did not finish within "
                                    f"{timeout:g} s") from None

    async def _run(self, slot: _Slot, timeout: float) -> None:
        world = self._world
        methods = {m for m, _, _ in slot.parts.values()}
        errors: list[GpuRuntimeError | None]
        try:
            if len(methods) != 1:
                raise InvalidArgument(f"the ranks called different collectives: "
                                      f"{sorted(methods)}")
            planned = _plan_of(world, methods.pop(), slot.parts)
            errors = await world.execute([planned], timeout)
        except GpuRuntimeError as exc:
            errors = [exc] * world.nranks
        for answer, error in zip(slot.answers, errors, strict=True):
            if answer.done():
                continue
            if error is None:
                answer.set_result(None)
            else:
                answer.set_exception(error)
                answer.exception()


_BUFFER_ARGS = {"all_reduce": 2, "broadcast": 1, "reduce": 2, "all_gather": 2,
                "reduce_scatter": 2, "all_to_all": 2}
"""How many leading arguments of each rank-view method are that rank's buffers."""


def _plan_of(world: Collective, method: str,
             parts: dict[int, tuple[str, tuple[Any, ...], dict[str, Any]]]) -> _Planned:
    """The single-controller plan of the ranks' matching calls of ``method``."""
    n, k = world.nranks, _BUFFER_ARGS[method]
    options = parts[0][1][k:]
    if any(parts[r][1][k:] != options for r in range(n)):
        raise InvalidArgument(f"the ranks called {method} with different options")
    lists: list[Any] = []
    for i in range(k):
        column = [parts[r][1][i] for r in range(n)]
        lists.append(None if all(b is None for b in column) else column)
    planner = getattr(world, f"_plan_{method}")
    planned: _Planned = planner(*lists, *options)
    return planned


class CollectiveRank:
    """Rank ``index`` of a ``Collective``: the same collectives, each taking this rank's
    buffer(s); the k-th call of every rank runs as the world's k-th collective (the ranks
    must make the same calls in the same order, with the same options)."""

    def __init__(self, world: Collective, index: int) -> None:
        self.world = world
        self.index = index
        self._portal = world._portal

    async def _join(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    timeout_secs: float | None) -> None:
        timeout = self.world._timeout(timeout_secs)
        rendezvous = self.world._rendezvous
        await self._portal.acall(rendezvous.join(self.index, method, args, kwargs, timeout))

    def all_reduce_async(self, send: GpuBuffer, recv: GpuBuffer | None = None,
                         op: str = "sum", *, timeout_secs: float | None = None,
                         ) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_reduce``."""
        return self._join("all_reduce", (send, recv, op), {}, timeout_secs)

    all_reduce = blocking(all_reduce_async)

    def broadcast_async(self, buf: GpuBuffer, root: int = 0, *,
                        timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.broadcast``."""
        return self._join("broadcast", (buf, root), {}, timeout_secs)

    broadcast = blocking(broadcast_async)

    def reduce_async(self, send: GpuBuffer, recv: GpuBuffer | None = None, root: int = 0,
                     op: str = "sum", *, timeout_secs: float | None = None,
                     ) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.reduce`` (``recv`` may be None but on the root)."""
        return self._join("reduce", (send, recv, root, op), {}, timeout_secs)

    reduce = blocking(reduce_async)

    def all_to_all_async(self, send: GpuBuffer, recv: GpuBuffer, *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_to_all``."""
        return self._join("all_to_all", (send, recv), {}, timeout_secs)

    all_to_all = blocking(all_to_all_async)

    def all_gather_async(self, send: GpuBuffer, recv: GpuBuffer, *,
                         timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.all_gather``."""
        return self._join("all_gather", (send, recv), {}, timeout_secs)

    all_gather = blocking(all_gather_async)

    def reduce_scatter_async(self, send: GpuBuffer, recv: GpuBuffer, op: str = "sum", *,
                             timeout_secs: float | None = None) -> Coroutine[Any, Any, None]:
        """This rank's part of ``Collective.reduce_scatter``."""
        return self._join("reduce_scatter", (send, recv, op), {}, timeout_secs)

    reduce_scatter = blocking(reduce_scatter_async)

    def __repr__(self) -> str:
        return f"CollectiveRank({self.index} of {self.world!r})"
