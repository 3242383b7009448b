"""The ``Graph`` builder of ``LangGraphGpuActor``: nodes over a shared state dict, plain and
conditional edges, entry and finish points; ``compile`` checks it is a DAG."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Self, TypeAlias

from atomr_accel.blueprint._checks import require_name
from atomr_accel.core._errors import InvalidArgument

__all__ = [
    "END",
    "CompiledGraph",
    "Graph",
    "GraphCycleError",
    "NodeFn",
    "Reducer",
    "Router",
    "UnknownNode",
]

END: Final = "__end__"
"""A conditional edge's target that ends the branch (no node runs after it)."""

NodeFn: TypeAlias = Callable[[dict[str, Any]], Any]
"""A node: ``fn(state)`` (sync on a worker thread, or async) returning a dict of state
updates, or None for none. It may call a device (blocking calls from a sync node)."""

Router: TypeAlias = Callable[[dict[str, Any]], Any]
"""A conditional edge's router: ``router(state)`` (sync or async) returns a mapping key."""


Reducer: TypeAlias = Callable[[Any, Any], Any]
"""How a state key combines an update with its value: ``reducer(current, update)``
(e.g. ``operator.add`` to append lists)."""


class GraphCycleError(InvalidArgument):
    """The graph has a cycle; ``cycle`` names its nodes in order (the first repeated last)."""

    def __init__(self, cycle: tuple[str, ...]) -> None:
        super().__init__(f"the graph has a cycle: {' -> '.join(cycle)}")
        self.cycle = cycle


class UnknownNode(InvalidArgument):
    """An edge, entry or finish point names a node that was never added."""

    def __init__(self, node: str, where: str) -> None:
        super().__init__(f"{where} names the unknown node {node!r}")
        self.node = node


@dataclass(frozen=True, slots=True)
class _Branch:
    router: Router
    mapping: Mapping[Hashable, str]


@dataclass(frozen=True, slots=True)
class CompiledGraph:
    """A checked DAG, ready for ``LangGraphGpuActor.spawn``.

    ``order`` is the deterministic topological order (ties in the order the
    nodes were added); ``edges[n]`` the plain successors of ``n``;
    ``branches[n]`` its conditional edge; ``preds[n]`` every node with an edge
    (plain or conditional) into ``n``; ``reducers`` the keys' reducers.
    """

    order: tuple[str, ...]
    fns: Mapping[str, NodeFn]
    edges: Mapping[str, tuple[str, ...]]
    branches: Mapping[str, _Branch]
    preds: Mapping[str, tuple[str, ...]]
    entry: str
    finish: frozenset[str]
    reducers: Mapping[str, Reducer]

    def merge(self, state: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with ``update`` applied: a key with a reducer (and a value) becomes
        ``reducer(value, update[key])``, any other key is replaced."""
        merged = dict(state)
        for key, value in update.items():
            reducer = self.reducers.get(key)
            merged[key] = value if reducer is None or key not in merged else reducer(
                merged[key], value)
        return merged

    def successors(self, node: str) -> tuple[str, ...]:
        """Every node ``node`` may lead to, through plain or conditional edges."""
        branch = self.branches.get(node)
        routed = () if branch is None else tuple(t for t in branch.mapping.values() if t != END)
        return tuple(dict.fromkeys((*self.edges.get(node, ()), *routed)))


class Graph:
    """Build a DAG of nodes over a shared state dict, then ``compile()`` it.

    ``reducers`` maps state keys to ``Reducer``s: a node's update to such a key
    is combined with the value (e.g. ``{"messages": operator.add}`` appends),
    so concurrent branches can add to one key; other keys are replaced.
    Every builder method returns the graph, so calls chain. ``compile``
    raises ``GraphCycleError`` (naming the cycle), ``UnknownNode``, or
    ``InvalidArgument`` for a missing entry or finish point, a node the entry
    cannot reach, a dead end that is not a finish point, or a finish point
    with outgoing edges.
    """

    def __init__(self, reducers: Mapping[str, Reducer] | None = None) -> None:
        reducers = {} if reducers is None else reducers
        if not isinstance(reducers, Mapping) or not all(
                isinstance(k, str) and callable(r) for k, r in reducers.items()):
            raise InvalidArgument(f"reducers must map state keys (str) to callables, got "
                                  f"{reducers!r}")
        self._reducers = dict(reducers)
        self._fns: dict[str, NodeFn] = {}
        self._edges: dict[str, list[str]] = {}
        self._branches: dict[str, _Branch] = {}
        self._entry: str | None = None
        self._finish: list[str] = []

    def add_node(self, name: str, fn: NodeFn) -> Self:
        """Add node ``name`` running ``fn(state) -> dict | None``."""
        require_name(name, "a node name")
        if name == END:
            raise InvalidArgument(f"{END!r} is reserved for the end of a conditional edge")
        if name in self._fns:
            raise InvalidArgument(f"node {name!r} is already in the graph")
        if not callable(fn):
            raise InvalidArgument(f"node {name!r}: fn must be callable, got {fn!r}")
        self._fns[name] = fn
        return self

    def add_edge(self, a: str, b: str) -> Self:
        """Run ``b`` after ``a`` (once all of ``b``'s active predecessors are done);
        ``add_edge(a, END)`` is ``set_finish_point(a)``."""
        if b == END:
            return self.set_finish_point(a)
        targets = self._edges.setdefault(require_name(a, "an edge's source"), [])
        if require_name(b, "an edge's target") not in targets:
            targets.append(b)
        return self

    def add_conditional_edges(self, a: str, router: Router,
                              mapping: Mapping[Hashable, str]) -> Self:
        """After ``a``, run ``mapping[router(state)]`` (``END`` runs nothing more).

        A node has at most one conditional edge; a router key missing from
        ``mapping`` fails the run with ``InvalidArgument``.
        """
        require_name(a, "an edge's source")
        if a in self._branches:
            raise InvalidArgument(f"node {a!r} already has conditional edges")
        if not callable(router):
            raise InvalidArgument(f"router must be callable, got {router!r}")
        if not isinstance(mapping, Mapping) or not mapping:
            raise InvalidArgument(f"mapping must be a non-empty mapping, got {mapping!r}")
        for target in mapping.values():
            require_name(target, "a conditional edge's target")
        self._branches[a] = _Branch(router, dict(mapping))
        return self

    def set_entry_point(self, name: str) -> Self:
        """The node every run starts at."""
        self._entry = require_name(name, "the entry point")
        return self

    def set_finish_point(self, name: str) -> Self:
        """A node a run may end at (a node without outgoing edges); may be called for several."""
        if require_name(name, "a finish point") not in self._finish:
            self._finish.append(name)
        return self

    def compile(self) -> CompiledGraph:
        """Check the graph and return it as a ``CompiledGraph`` (see the class's errors)."""
        self._check_names()
        edges = {a: tuple(bs) for a, bs in self._edges.items()}
        branches = dict(self._branches)
        if self._entry is None:
            raise InvalidArgument("the graph has no entry point; call set_entry_point(name)")
        if not self._finish:
            raise InvalidArgument("the graph has no finish point; call set_finish_point(name)")
        preds: dict[str, list[str]] = {n: [] for n in self._fns}
        draft = CompiledGraph((), self._fns, edges, branches, {}, self._entry,
                              frozenset(self._finish), self._reducers)
        for node in self._fns:
            for succ in draft.successors(node):
                preds[succ].append(node)
        _check_acyclic(self._fns, draft.successors)
        self._check_shape(draft)
        order = _topological(self._fns, preds, draft.successors)
        return CompiledGraph(order, dict(self._fns), edges, branches,
                             {n: tuple(p) for n, p in preds.items()}, self._entry,
                             frozenset(self._finish), dict(self._reducers))

    def _check_names(self) -> None:
        known = self._fns
        for a, targets in self._edges.items():
            for node in (a, *targets):
                if node not in known:
                    raise UnknownNode(node, f"the edge {a!r} -> {node!r}")
        for a, branch in self._branches.items():
            if a not in known:
                raise UnknownNode(a, "a conditional edge")
            for target in branch.mapping.values():
                if target != END and target not in known:
                    raise UnknownNode(target, f"the conditional edge from {a!r}")
        if self._entry is not None and self._entry not in known:
            raise UnknownNode(self._entry, "the entry point")
        for node in self._finish:
            if node not in known:
                raise UnknownNode(node, "a finish point")

    def _check_shape(self, graph: CompiledGraph) -> None:
        reached = {graph.entry}
        todo = [graph.entry]
        while todo:
            for succ in graph.successors(todo.pop()):
                if succ not in reached:
                    reached.add(succ)
                    todo.append(succ)
        for node in self._fns:
            if node not in reached:
                raise InvalidArgument(f"node {node!r} cannot be reached from the entry point "
                                      f"{graph.entry!r}")
            leads = bool(graph.edges.get(node)) or node in graph.branches
            if node in graph.finish and leads:
                raise InvalidArgument(f"finish point {node!r} has outgoing edges")
            if node not in graph.finish and not leads:
                raise InvalidArgument(f"node {node!r} has no outgoing edge and is not a finish "
                                      "point; call set_finish_point or add an edge")


def _check_acyclic(nodes: Mapping[str, object],
                   successors: Callable[[str], tuple[str, ...]]) -> None:
    """Raise ``GraphCycleError`` naming the first cycle a depth-first search meets."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    for root in nodes:
        if root in state:
            continue
        path: list[str] = [root]
        stack = [iter(successors(root))]
        state[root] = 1
        while stack:
            succ = next(stack[-1], None)
            if succ is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(succ) == 1:
                raise GraphCycleError((*path[path.index(succ):], succ))
            elif succ not in state:
                state[succ] = 1
                path.append(succ)
                stack.append(iter(successors(succ)))


def _topological(nodes: Mapping[str, object], preds: Mapping[str, list[str]],
                 successors: Callable[[str], tuple[str, ...]]) -> tuple[str, ...]:
    """Kahn's order; among ready nodes, the one added first goes first."""
    rank = {node: i for i, node in enumerate(nodes)}
    waiting = {node: len(preds[node]) for node in nodes}
    ready = sorted((n for n, k in waiting.items() if k == 0), key=rank.__getitem__)
    order: list[str] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for succ in successors(node):
            waiting[succ] -= 1
            if waiting[succ] == 0:
                ready.append(succ)
                ready.sort(key=rank.__getitem__)
    return tuple(order)
