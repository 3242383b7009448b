"""The original package's ``LangGraphGpuActor``: a chain of ``n_nodes`` nodes, node ``i``
multiplying a list of floats by ``i + 1``, built on the same ``Graph`` machinery."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from atomr_accel.agents._graph import CompiledGraph, Graph
from atomr_accel.agents._graph_actor import STEP_TIMEOUT, LangGraphGpuActor
from atomr_accel.blueprint import SystemLike, require_positive_int, twin
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.original._forms import attach_spawn

__all__ = ["OriginalLangGraphGpuActor", "Scale", "chain_graph", "spawn_original"]

KEY: Final = "x"
"""The state key the original form's list of floats travels under."""


@dataclass(frozen=True, slots=True)
class Scale:
    """The original's node ``i``: multiplies the list under ``"x"`` by ``factor`` (``i + 1``)."""

    factor: float

    async def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        """Return ``{"x": [v * factor for v in state["x"]]}``."""
        return {KEY: [v * self.factor for v in state[KEY]]}


def chain_graph(n_nodes: int) -> Graph:
    """The original's DAG: ``node0 -> node1 -> ...``, node ``i`` a ``Scale(i + 1)``."""
    require_positive_int("n_nodes", n_nodes)
    graph = Graph()
    for i in range(n_nodes):
        graph.add_node(f"node{i}", Scale(float(i + 1)))
        if i:
            graph.add_edge(f"node{i - 1}", f"node{i}")
    return graph.set_entry_point("node0").set_finish_point(f"node{n_nodes - 1}")


def _floats(state: object) -> list[float]:
    if isinstance(state, str | bytes) or not hasattr(state, "__iter__"):
        raise InvalidArgument(f"state must be a list of floats, got {state!r:.60}")
    try:
        values = [float(v) for v in state]
    except (TypeError, ValueError):
        raise InvalidArgument(f"state must be a list of floats, got {state!r:.60}") from None
    return values


class OriginalLangGraphGpuActor:
    """The original's ``LangGraphGpuActor`` handle: ``step`` multiplies by ``n_nodes!``."""

    def __init__(self, client: LangGraphGpuActor) -> None:
        self._client = client
        self._portal = client._portal

    @property
    def client(self) -> LangGraphGpuActor:
        """The executor's own client underneath (``stats``, ``checkpoints``, ``stop``)."""
        return self._client

    def step_async(self, state: list[float], timeout_secs: float = STEP_TIMEOUT,
                   ) -> Coroutine[Any, Any, list[float]]:
        """Run the chain once on ``state``; node ``i`` multiplies by ``i + 1``."""
        return self._step(self._client.step_async({KEY: _floats(state)}, timeout_secs))

    @staticmethod
    async def _step(run: Coroutine[Any, Any, dict[str, Any]]) -> list[float]:
        result: list[float] = (await run)[KEY]
        return result

    step = twin(step_async)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._client.path})"


def spawn_original(spawn: Callable[..., LangGraphGpuActor], system: SystemLike,
                   n_nodes: int = 2, name: str | None = None) -> OriginalLangGraphGpuActor:
    """A chain of ``n_nodes`` nodes, node ``i`` multiplying by ``i + 1``, behind an
    ``OriginalLangGraphGpuActor`` whose ``step(state: list[float], timeout_secs=10.0)``
    returns the product."""
    if name is not None and not isinstance(name, str):
        raise InvalidArgument(f"name must be a str or None, got {name!r}")
    return OriginalLangGraphGpuActor(spawn(system, chain_graph(n_nodes), name))


attach_spawn(LangGraphGpuActor, spawn_original, "graph",
             lambda value: isinstance(value, Graph | CompiledGraph))
