"""SpeculativeDecoder: a draft model proposes tokens, the verifier keeps what it agrees with."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atomr_accel.actor import Props, Reply
from atomr_accel.blueprint import (
    BlueprintActor,
    BlueprintClient,
    SystemLike,
    require_positive_int,
    twins_with_old_name,
)
from atomr_accel.blueprint._actor import GetStats
from atomr_accel.blueprint._invoke import invoke
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import InvalidModelOutput

__all__ = ["Decoded", "DecoderStats", "SpeculativeDecoder", "accept_draft"]

DraftFn = Callable[[tuple[int, ...], int], Any]
VerifierFn = Callable[[tuple[int, ...], tuple[int, ...]], Any]


def _tokens(value: Any, role: str) -> list[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | np.ndarray):
        raise InvalidModelOutput(f"{role} returned {type(value).__name__}, not a token sequence")
    tokens = list(value)
    for token in tokens:
        if not isinstance(token, numbers.Integral) or isinstance(token, bool):
            raise InvalidModelOutput(f"{role} returned a token {token!r} that is not an int")
    return [int(t) for t in tokens]


def accept_draft(proposal: Sequence[int], predictions: Sequence[int]) -> list[int]:
    """Return the tokens one verification round emits.

    ``predictions[i]`` is the verifier's greedy token after the context plus
    ``proposal[:i]`` (so there are ``len(proposal) + 1``). The longest prefix
    of ``proposal`` that matches is accepted; then comes the verifier's own
    token at the first mismatch (the correction), or, when all were accepted,
    its token after the last one (the bonus). Raises ``InvalidModelOutput``
    for a wrong number of predictions.
    """
    if len(predictions) != len(proposal) + 1:
        raise InvalidModelOutput(
            f"verifier returned {len(predictions)} predictions for {len(proposal)} proposed "
            f"tokens; it must return {len(proposal) + 1} (one per position, plus the next)")
    for i, token in enumerate(proposal):
        if predictions[i] != token:
            return [*proposal[:i], predictions[i]]
    return [*proposal, predictions[len(proposal)]]


@dataclass(frozen=True, slots=True)
class Decoded:
    """The generated tokens (without the prompt) and how the drafting went."""

    tokens: tuple[int, ...]
    drafted: int
    accepted: int
    verifier_calls: int

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed ones (0 when none were proposed)."""
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass(frozen=True, slots=True)
class DecoderStats:
    """Totals over every finished request."""

    requests: int
    tokens: int
    drafted: int
    accepted: int
    verifier_calls: int


@dataclass(frozen=True, slots=True)
class _Generate:
    prompt: tuple[int, ...]
    max_tokens: int | None


class _DecoderActor(BlueprintActor):
    def __init__(self, draft: DraftFn, verifier: VerifierFn, k: int, max_tokens: int,
                 eos: int | None) -> None:
        super().__init__()
        self.draft = draft
        self.verifier = verifier
        self.k = k
        self.max_tokens = max_tokens
        self.eos = eos
        self.totals = [0, 0, 0, 0, 0]  # requests, tokens, drafted, accepted, verifier calls

    async def receive(self, message: Any) -> Any:
        """Handle generate requests, finished results and stats."""
        cls = type(message)
        if cls is _Generate:
            limit = self.max_tokens if message.max_tokens is None else message.max_tokens
            reply = self.context.defer_reply()
            self.start_task(self.answer(reply, self._decode(message.prompt, limit, reply)))
        elif cls is Decoded:
            for i, value in enumerate((1, len(message.tokens), message.drafted,
                                       message.accepted, message.verifier_calls)):
                self.totals[i] += value
        elif cls is GetStats:
            return DecoderStats(*self.totals)
        else:
            self.unhandled(message)
        return None

    async def _decode(self, prompt: tuple[int, ...], max_tokens: int, reply: Reply) -> Decoded:
        """Decode after ``prompt`` until ``max_tokens``, ``eos`` or the caller gives up; the
        result is told to this actor too."""
        context = list(prompt)
        out: list[int] = []
        drafted = accepted = calls = 0
        while len(out) < max_tokens and not reply.done():
            room = max_tokens - len(out)
            want = min(self.k, room - 1)  # proposal + one verifier token fills the room
            proposal = _tokens(await invoke(self.draft, tuple(context), want), "draft")
            if len(proposal) > want:
                raise InvalidModelOutput(
                    f"draft returned {len(proposal)} tokens when asked for {want}")
            predictions = _tokens(
                await invoke(self.verifier, tuple(context), tuple(proposal)), "verifier")
            emitted = accept_draft(proposal, predictions)
            calls += 1
            drafted += len(proposal)
            accepted += len(emitted) - 1
            for token in emitted[:room]:
                out.append(token)
                context.append(token)
                if token == self.eos:
                    room = 0
                    break
            if room == 0:
                break
        result = Decoded(tuple(out), drafted, accepted, calls)
        self.context.self_ref.tell(result)
        return result


class SpeculativeDecoder(BlueprintClient):
    """Greedy speculative decoding: the output is exactly what the verifier alone would emit.

    Each round the draft model proposes up to ``k`` tokens
    (``draft(context, n) -> n tokens``, ``n <= k``) and the verifier scores
    them in one call (``verifier(context, proposal) -> len(proposal) + 1``
    greedy tokens: its choice after ``context + proposal[:i]`` for each ``i``).
    The matching prefix is accepted, then the verifier's correction at the
    first mismatch, or its bonus token when all were accepted (see
    ``accept_draft``). Decoding stops after ``max_tokens`` new tokens or at
    ``eos``. Both models may be sync (run on a worker thread) or async; a bad
    output fails the request with ``InvalidModelOutput``.
    """

    @staticmethod
    def props(draft: DraftFn, verifier: VerifierFn, *, k: int, max_tokens: int,
              eos: int | None = None) -> Props:
        """Props for the decoder actor (arguments as in ``spawn``); checks them now."""
        if not callable(draft) or not callable(verifier):
            raise InvalidArgument("draft and verifier must be callable")
        require_positive_int("k", k)
        require_positive_int("max_tokens", max_tokens)
        return Props(_DecoderActor, draft, verifier, k, max_tokens, eos)

    @classmethod
    def spawn(cls, system: SystemLike, draft: DraftFn, verifier: VerifierFn, *, k: int,
              max_tokens: int, eos: int | None = None,
              name: str | None = None) -> SpeculativeDecoder:
        """Start a SpeculativeDecoder in ``system`` and return its client.

        ``spawn(system, draft, verifier, *, k, max_tokens, eos=None,
        name=None)`` decodes with ``draft`` and ``verifier`` and returns this
        class's client; ``max_tokens`` is the default limit per request.
        Raises ``InvalidArgument`` for a bad setting."""
        props = cls.props(draft, verifier, k=k, max_tokens=max_tokens, eos=eos)
        return cls._start(system, props, name)

    async def generate_async(self, prompt: Sequence[int], *, max_tokens: int | None = None,
                       timeout_secs: float | None = None) -> Decoded:
        """Decode after ``prompt``; return up to ``max_tokens`` new tokens and draft figures.

        ``max_tokens`` defaults to the decoder's. Raises what a model raised,
        ``InvalidModelOutput``, ``InvalidArgument``, ``AskTimeout`` or
        ``ActorStopped``.
        """
        require_positive_int("max_tokens", max_tokens, allow_none=True)
        result: Decoded = await self._ask(_Generate(tuple(prompt), max_tokens), timeout_secs)
        return result

    async def stats_async(self, *, timeout_secs: float | None = None) -> DecoderStats:
        """Totals over finished requests: tokens, drafted, accepted, verifier calls."""
        stats: DecoderStats = await self._ask(GetStats(), timeout_secs)
        return stats

    generate, generate_blocking = twins_with_old_name(generate_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
