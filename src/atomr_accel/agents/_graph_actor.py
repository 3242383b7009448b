"""LangGraphGpuActor: runs a compiled ``Graph`` once per ``step``, its independent nodes
concurrently, each node in a supervised child actor, with retries and checkpoints."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Final

from atomr_accel.actor import Actor, ActorRef, OneForOneStrategy, Props, Reply
from atomr_accel.agents._graph import END, CompiledGraph, Graph, NodeFn
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    require_positive_int,
    require_timeout,
    twin,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument

__all__ = [
    "Checkpoint",
    "GraphStats",
    "LangGraphGpuActor",
    "NodeFailed",
    "RunInProgress",
    "UnknownRun",
]

STEP_TIMEOUT: Final = 10.0
"""The default ``timeout_secs`` of ``step``, seconds."""
MAX_RETRIES: Final = 2
KEEP_RUNS: Final = 128
_ANSWER_GRACE: Final = 5.0


class NodeFailed(GpuRuntimeError):
    """A node still failed after its retries; the node's last error is ``__cause__``.

    ``run_id`` names the run, whose checkpoints are kept: ``resume(run_id)``
    continues it without re-running its completed nodes.
    """

    def __init__(self, run_id: str, node: str, attempts: int, cause: BaseException) -> None:
        super().__init__(f"run {run_id!r}: node {node!r} failed {attempts} time(s); last "
                         f"error: {type(cause).__name__}: {cause}; resume({run_id!r}) continues "
                         "from the last checkpoint")
        self.run_id = run_id
        self.node = node
        self.attempts = attempts


class UnknownRun(InvalidArgument):
    """``resume`` or ``checkpoints`` named a run the executor does not keep."""


class RunInProgress(InvalidArgument):
    """``resume`` named a run that is still running."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The state of run ``run_id`` right after ``node`` completed (a copy)."""

    run_id: str
    node: str
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class GraphStats:
    """Runs ``started`` (resumes included), ``completed`` and ``failed``; node calls made
    (``node_calls``, retries included) and ``retries``; runs kept for ``resume``."""

    started: int
    completed: int
    failed: int
    node_calls: int
    retries: int
    kept_runs: int


@dataclass(slots=True)
class _Run:
    run_id: str
    state: dict[str, Any]
    done: set[str] = field(default_factory=set)
    skipped: set[str] = field(default_factory=set)
    activated: set[str] = field(default_factory=set)
    routed: set[str] = field(default_factory=set)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    running: bool = False
    finished: bool = False


@dataclass(frozen=True, slots=True)
class _Step:
    state: dict[str, Any]
    timeout_secs: float


@dataclass(frozen=True, slots=True)
class _Resume:
    run_id: str
    timeout_secs: float


@dataclass(frozen=True, slots=True)
class _GetCheckpoints:
    run_id: str


@dataclass(frozen=True, slots=True)
class _RunNode:
    state: dict[str, Any]


class _NodeActor(Actor):
    """Runs one node's function; a raise fails the call and its supervisor restarts it."""

    def __init__(self, name: str, fn: NodeFn) -> None:
        self.name = name
        self.fn = fn

    async def receive(self, message: Any) -> Any:
        """Return the node's state update (a dict) for a ``_RunNode``."""
        if type(message) is not _RunNode:
            raise TypeError(f"a graph node does not handle {message!r}")
        update = await invoke(self.fn, message.state)
        if update is None:
            return {}
        if not isinstance(update, Mapping):
            raise InvalidArgument(f"node {self.name!r} returned {type(update).__name__}; a node "
                                  "returns a dict of state updates or None")
        return dict(update)


class _Attempt:
    """One node's outcome within a wave: its update, or the error that ended its retries."""

    __slots__ = ("attempts", "error", "update")

    def __init__(self) -> None:
        self.update: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.attempts = 0


class _GraphActor(BlueprintActor):
    # restart a failed node's actor every time; the executor bounds the retries itself
    supervisor_strategy = OneForOneStrategy(max_restarts=None)

    def __init__(self, graph: CompiledGraph, max_retries: int, keep_runs: int) -> None:
        super().__init__()
        self.graph = graph
        self.max_retries = max_retries
        self.keep_runs = keep_runs
        self.nodes: dict[str, ActorRef] = {}
        self.runs: OrderedDict[str, _Run] = OrderedDict()
        self.run_ids = count(1)
        self.started = self.completed = self.failed = self.node_calls = self.retries = 0

    async def pre_start(self) -> None:
        """Start one supervised child actor per node."""
        for i, node in enumerate(self.graph.order):
            self.nodes[node] = self.context.spawn(Props(_NodeActor, node, self.graph.fns[node]),
                                                  f"node-{i}")

    async def receive(self, message: Any) -> Any:
        """Start runs and resumes; answer checkpoints and stats."""
        cls = type(message)
        if cls is _Step:
            run = _Run(f"run-{next(self.run_ids)}", dict(message.state))
            run.activated.add(self.graph.entry)
            self._keep(run)
            self._start(run, message.timeout_secs)
        elif cls is _Resume:
            kept = self.runs.get(message.run_id)
            if kept is None:
                self.context.defer_reply().set_exception(self._unknown(message.run_id))
            elif kept.running:
                self.context.defer_reply().set_exception(
                    RunInProgress(f"run {message.run_id!r} is still running"))
            elif kept.finished:
                return dict(kept.state)
            else:
                self._start(kept, message.timeout_secs)
        elif cls is _GetCheckpoints:
            asked = self.runs.get(message.run_id)
            if asked is None:
                self.context.defer_reply().set_exception(self._unknown(message.run_id))
                return None
            return tuple(asked.checkpoints)
        elif cls is GetStats:
            return GraphStats(self.started, self.completed, self.failed, self.node_calls,
                              self.retries, len(self.runs))
        else:
            self.unhandled(message)
        return None

    def _unknown(self, run_id: str) -> UnknownRun:
        return UnknownRun(f"no run {run_id!r} is kept (the executor keeps the last "
                          f"{self.keep_runs})")

    def _keep(self, run: _Run) -> None:
        self.runs[run.run_id] = run
        while len(self.runs) > self.keep_runs:
            oldest = next((r for r in self.runs.values() if not r.running), None)
            if oldest is None:
                break
            del self.runs[oldest.run_id]

    def _start(self, run: _Run, timeout_secs: float) -> None:
        run.running = True
        self.started += 1
        deadline = asyncio.get_running_loop().time() + timeout_secs
        self.start_task(self._execute(run, deadline, self.context.defer_reply()))

    async def _execute(self, run: _Run, deadline: float, reply: Reply) -> None:
        try:
            await self._waves(run, deadline)
        except asyncio.CancelledError:
            reply.set_exception(self.stopped_error())
            raise
        except Exception as exc:
            self.failed += 1
            reply.set_exception(exc)
        else:
            run.finished = True
            self.completed += 1
            reply.set_result(dict(run.state))
        finally:
            run.running = False

    async def _waves(self, run: _Run, deadline: float) -> None:
        """Run every ready node of the run together, merge, route, repeat until none is left."""
        graph = self.graph
        while True:
            for node in graph.order:  # route after the merge: routers see the wave's updates
                if node in run.done and node in graph.branches and node not in run.routed:
                    await self._route(run, node)
                    run.routed.add(node)
            wave = self._ready(run)
            if not wave:
                return
            snapshot = run.state
            outcomes = [_Attempt() for _ in wave]
            await asyncio.gather(*(self._attempt(node, snapshot, outcome, deadline)
                                   for node, outcome in zip(wave, outcomes, strict=True)))
            failure: tuple[str, _Attempt] | None = None
            for node, outcome in zip(wave, outcomes, strict=True):
                if outcome.update is None:
                    failure = failure or (node, outcome)
                    continue
                run.state = graph.merge(run.state, outcome.update)
                run.done.add(node)
                run.checkpoints.append(Checkpoint(run.run_id, node, dict(run.state)))
                run.activated.update(graph.edges.get(node, ()))
            if failure is not None:
                node, outcome = failure
                assert outcome.error is not None
                raise NodeFailed(run.run_id, node, outcome.attempts,
                                 outcome.error) from outcome.error

    def _ready(self, run: _Run) -> list[str]:
        """The nodes to run next, in topological order; resolve the ones no edge activated."""
        graph = self.graph
        wave: list[str] = []
        for node in graph.order:  # topological: a node's preds are resolved before it
            if node in run.done or node in run.skipped:
                continue
            preds = graph.preds[node]
            if not all(p in run.done or p in run.skipped for p in preds):
                continue
            if node in run.activated:
                wave.append(node)
            else:
                run.skipped.add(node)
        return wave

    async def _route(self, run: _Run, node: str) -> None:
        branch = self.graph.branches[node]
        key = await invoke(branch.router, dict(run.state))
        try:
            target = branch.mapping[key]
        except (KeyError, TypeError):
            raise InvalidArgument(f"the router after {node!r} returned {key!r}, not one of "
                                  f"{list(branch.mapping)!r}") from None
        if target != END:
            run.activated.add(target)

    async def _attempt(self, node: str, state: dict[str, Any], outcome: _Attempt,
                       deadline: float) -> None:
        """Call ``node`` until it succeeds, ``max_retries`` retries are spent or time is up."""
        loop = asyncio.get_running_loop()
        while True:
            left = deadline - loop.time()
            if left <= 0:
                outcome.error = outcome.error or TimeoutError(
                    f"the run's time ran out before node {node!r} ran")
                return
            outcome.attempts += 1
            self.node_calls += 1
            try:
                outcome.update = await self.nodes[node].ask(_RunNode(dict(state)), timeout=left)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the node's error, or the runtime's time-out
                outcome.error = exc
                if outcome.attempts > self.max_retries:
                    return
                self.retries += 1


def _graph(graph: object) -> CompiledGraph:
    if isinstance(graph, Graph):
        return graph.compile()
    if isinstance(graph, CompiledGraph):
        return graph
    raise InvalidArgument(f"graph must be a Graph or a CompiledGraph, got {graph!r}")


def _state(state: object) -> dict[str, Any]:
    if not isinstance(state, Mapping):
        raise InvalidArgument(f"state must be a dict, got {type(state).__name__}")
    return dict(state)


def _run_id(run_id: object) -> str:
    if not isinstance(run_id, str):
        raise InvalidArgument(f"run_id must be a str, got {run_id!r}")
    return run_id


class LangGraphGpuActor(BlueprintClient):
    """A DAG executor: ``step(state)`` runs a compiled ``Graph`` once and returns the state.

    * Nodes run in a deterministic topological order, in waves: every node
      whose predecessors are resolved runs in the same wave, concurrently
      (async nodes on the event loop, sync nodes on worker threads), each on
      a copy of the state as the wave began; the wave's updates are merged in
      topological order, then the conditional edges route. A node that no
      active edge reaches is skipped.
    * Each node runs in its own child actor, supervised by the executor: a
      node that raises is restarted and called again, up to ``max_retries``
      retries; then the run fails with ``NodeFailed`` whose ``__cause__`` is
      the node's error. A run out of time (``timeout_secs``) fails the same
      way, its cause the time-out.
    * After each completed node the state is checkpointed under the run's id;
      ``resume(run_id)`` continues a failed run from its last checkpoint,
      without running its completed nodes again.

    Concurrent ``step`` calls run concurrently, each node's calls one at a
    time. Methods are ``name_async`` with blocking twins ``name``.
    """

    @staticmethod
    def props(graph: Graph | CompiledGraph, max_retries: int = MAX_RETRIES,
              keep_runs: int = KEEP_RUNS) -> Props:
        """Props for the executor actor (see ``spawn``)."""
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidArgument(f"max_retries must be an int >= 0, got {max_retries!r}")
        require_positive_int("keep_runs", keep_runs)
        return Props(_GraphActor, _graph(graph), max_retries, keep_runs)

    @classmethod
    def spawn(cls, system: SystemLike, graph: Graph | CompiledGraph, name: str | None = None,
              max_retries: int = MAX_RETRIES, *, keep_runs: int = KEEP_RUNS,
              ) -> LangGraphGpuActor:
        """Start an executor in ``system`` and return its client.

        ``spawn(system, graph, name=None, max_retries=2, *, keep_runs=128)``
        runs ``graph`` (a ``Graph``, compiled here, or a ``CompiledGraph``);
        the last ``keep_runs`` runs are kept for ``resume``.
        """
        return cls._start(system, cls.props(graph, max_retries, keep_runs), name)

    def step_async(self, state: Mapping[str, Any], timeout_secs: float = STEP_TIMEOUT,
                   ) -> Coroutine[Any, Any, dict[str, Any]]:
        """Run the graph once from ``state``; return the final state.

        Raises ``NodeFailed`` (resumable by its ``run_id``), ``InvalidArgument``
        for a router key its mapping lacks.
        """
        timeout = require_timeout(timeout_secs)
        return self._call(_Step(_state(state), timeout), timeout + _ANSWER_GRACE, "step")

    step = twin(step_async)

    def resume_async(self, run_id: str, timeout_secs: float = STEP_TIMEOUT,
                     ) -> Coroutine[Any, Any, dict[str, Any]]:
        """Continue run ``run_id`` from its last checkpoint; return its final state.

        Completed nodes are not run again; a run that had finished returns its
        state at once. Raises ``UnknownRun``, ``RunInProgress``, or as ``step``.
        """
        timeout = require_timeout(timeout_secs)
        return self._call(_Resume(_run_id(run_id), timeout), timeout + _ANSWER_GRACE, "resume")

    resume = twin(resume_async)

    def checkpoints_async(self, run_id: str, timeout_secs: float = STEP_TIMEOUT,
                          ) -> Coroutine[Any, Any, tuple[Checkpoint, ...]]:
        """Run ``run_id``'s checkpoints, one per completed node, oldest first."""
        return self._call(_GetCheckpoints(_run_id(run_id)),
                          require_timeout(timeout_secs), "checkpoints")

    checkpoints = twin(checkpoints_async)

    def stats_async(self, timeout_secs: float = STEP_TIMEOUT,
                    ) -> Coroutine[Any, Any, GraphStats]:
        """The executor's ``GraphStats``."""
        return self._call(GetStats(), require_timeout(timeout_secs), "stats")

    stats = twin(stats_async)
