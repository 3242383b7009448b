"""MoeRouter: route each token to its top-k experts and combine their outputs by weight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.actor import Props
from atomr_accel.blueprint import (
    BlueprintClient,
    SystemLike,
    require_positive_int,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats, Serve
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import InvalidModelOutput
from atomr_accel.patterns._worker import ModelSpec, WorkerParent, checked_models

__all__ = ["MoeRouter", "RouterStats", "top_k_gating"]

Array = np.ndarray[Any, Any]


def top_k_gating(scores: Any, k: int) -> tuple[Array, Array]:
    """Pick each token's ``k`` best experts and weight them by a softmax over their scores.

    ``scores`` is ``tokens x experts``. Returns ``(experts, weights)``, both
    ``tokens x k``: expert indices best first (the lower index wins a tie) and
    float64 weights that sum to 1 per token. Raises ``InvalidModelOutput`` for
    scores that are not a finite 2-D array, ``InvalidArgument`` unless
    ``1 <= k <= experts``.
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 2:
        raise InvalidModelOutput(f"gate scores must be tokens x experts, got shape {s.shape}")
    if not np.isfinite(s).all():
        raise InvalidModelOutput("gate returned scores that are not finite")
    if not 1 <= k <= s.shape[1]:
        raise InvalidArgument(f"top_k must be between 1 and {s.shape[1]}, got {k}")
    experts = np.argsort(-s, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(s, experts, axis=1)
    e = np.exp(chosen - chosen[:, :1])  # the best score first: exponents <= 0
    return experts, e / e.sum(axis=1, keepdims=True)


@dataclass(frozen=True, slots=True)
class RouterStats:
    """Requests and tokens routed, tokens sent to each expert, and expert restarts."""

    requests: int
    tokens: int
    expert_tokens: tuple[int, ...]
    restarts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Routed:
    counts: tuple[int, ...]


class _RouterActor(WorkerParent):
    def __init__(self, gate: Callable[[Array], Any], experts: Sequence[ModelSpec], top_k: int,
                 max_restarts: int | None, within: float | None) -> None:
        super().__init__("expert", experts, max_restarts, within)
        self.gate = gate
        self.top_k = top_k
        self.requests = self.tokens = 0
        self.expert_tokens = [0] * len(self.workers)

    async def serve(self, message: Any) -> Any:
        """Handle route requests, routing tallies and stats."""
        cls = type(message)
        if cls is Serve:
            self.start_task(self.answer(self.context.defer_reply(), self._mix(message.x)))
        elif cls is _Routed:
            self.requests += 1
            self.tokens += sum(message.counts) // self.top_k
            for i, count in enumerate(message.counts):
                self.expert_tokens[i] += count
        elif cls is GetStats:
            return RouterStats(self.requests, self.tokens, tuple(self.expert_tokens),
                               tuple(self.restarts))
        else:
            self.unhandled(message)
        return None

    async def _mix(self, x: Any) -> Array:
        """The mixture's output for ``x``; tells this actor the tokens each expert took."""
        xs = np.asarray(x)
        single = xs.ndim == 1
        if single:
            xs = xs[None, :]
        if xs.ndim != 2:
            raise InvalidArgument(f"route takes one token (1-D) or tokens x features, "
                                  f"got shape {xs.shape}")
        n_experts = len(self.workers)
        scores = np.asarray(await invoke(self.gate, xs))
        if scores.shape != (xs.shape[0], n_experts):
            raise InvalidModelOutput(f"gate returned shape {scores.shape}; expected "
                                     f"{(xs.shape[0], n_experts)} (tokens x experts)")
        chosen, weights = top_k_gating(scores, self.top_k)
        groups = []
        for expert in range(n_experts):
            rows, slots = np.nonzero(chosen == expert)
            if rows.size:
                groups.append((expert, rows, weights[rows, slots]))
        outputs = await asyncio.gather(*(
            self.ask_worker(expert, xs[rows])
            for expert, rows, _ in groups))
        combined: Array | None = None
        for (expert, rows, w), raw in zip(groups, outputs, strict=True):
            y = np.asarray(raw)
            if y.ndim < 1 or y.shape[0] != rows.size:
                raise InvalidModelOutput(f"expert {expert} returned shape {y.shape} for "
                                         f"{rows.size} tokens; it must return one row per token")
            if combined is None:
                combined = np.zeros((xs.shape[0], *y.shape[1:]),
                                    dtype=np.result_type(y.dtype, np.float64))
            elif y.shape[1:] != combined.shape[1:]:
                raise InvalidModelOutput(f"expert {expert} returned rows of shape {y.shape[1:]}; "
                                         f"others returned {combined.shape[1:]}")
            combined[rows] += w.reshape(-1, *([1] * (y.ndim - 1))) * y
        assert combined is not None  # every token has top_k >= 1 experts
        self.context.self_ref.tell(_Routed(tuple(int((chosen == e).sum())
                                                 for e in range(n_experts))))
        return combined[0] if single else combined


class MoeRouter(BlueprintClient):
    """Mixture-of-experts routing: top-k gating, experts in parallel, weighted combine.

    For input ``x`` (one token as a 1-D array, or ``tokens x features``) the
    gate returns ``tokens x experts`` scores; each token goes to its
    ``top_k`` best experts with weights from a softmax over those scores
    (``top_k_gating``). Each expert runs in its own supervised child actor
    (``expert-0``, ...) and is called once per request with all its tokens
    (``expert(rows) -> one output row per token``); the experts of one
    request run in parallel. The output for a token is the weighted sum of
    its experts' rows, in float64 or wider. Gate and experts may be sync (run
    on a worker thread) or async, for example running on a device. An expert
    that raises fails the request with that error and is restarted.
    """

    @staticmethod
    def props(gate: Callable[[Array], Any], experts: Sequence[ModelSpec], *, top_k: int,
              max_restarts: int | None = 10, within: float | None = 60.0) -> Props:
        """Props for the router actor (arguments as in ``spawn``); checks them now."""
        if not callable(gate):
            raise InvalidArgument(f"gate must be callable, got {gate!r}")
        experts = checked_models("a router", "expert", experts)
        require_positive_int("top_k", top_k)
        if top_k > len(experts):
            raise InvalidArgument(f"top_k is {top_k} but there are only {len(experts)} experts")
        return Props(_RouterActor, gate, experts, top_k, max_restarts, within)

    @classmethod
    def spawn(cls, system: SystemLike, gate: Callable[[Array], Any],
              experts: Sequence[ModelSpec], *, top_k: int, max_restarts: int | None = 10,
              within: float | None = 60.0, name: str | None = None) -> MoeRouter:
        """Start a MoeRouter in ``system`` and return its client.

        ``spawn(system, gate, experts, *, top_k, max_restarts=10, within=60.0,
        name=None)`` routes to ``experts`` by ``gate`` and returns this class's
        client. Raises ``InvalidArgument`` for a bad setting."""
        props = cls.props(gate, experts, top_k=top_k, max_restarts=max_restarts, within=within)
        return cls._start(system, props, name)

    async def route_async(self, x: Any, *, timeout_secs: float | None = None) -> Array:
        """Return the mixture's output for ``x`` (1-D in, 1-D out; 2-D in, 2-D out).

        Raises what the gate or an expert raised, ``InvalidModelOutput``,
        ``InvalidArgument``, ``AskTimeout`` or ``ActorStopped``.
        """
        result: Array = await self._ask(Serve(x), timeout_secs)
        return result

    async def stats_async(self, *, timeout_secs: float | None = None) -> RouterStats:
        """Requests, tokens, tokens per expert and expert restarts."""
        stats: RouterStats = await self._ask(GetStats(), timeout_secs)
        return stats

    route, route_blocking = twins_with_old_name(route_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
