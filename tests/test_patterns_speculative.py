"""SpeculativeDecoder: output equals verifier-only greedy decoding, bonus and correction paths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from atomr_accel import ActorStopped, InvalidArgument
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import InvalidModelOutput, SpeculativeDecoder, accept_draft

pytestmark = pytest.mark.anyio

VOCAB = 50
PROMPT = (3, 1, 4)


def greedy(context: Sequence[int]) -> int:
    """The verifier's deterministic greedy next token."""
    return (7 * context[-1] + 3 * len(context) + sum(context)) % VOCAB


def verifier(context: tuple[int, ...], proposal: tuple[int, ...]) -> list[int]:
    """One "forward pass": greedy's choice after each prefix of the proposal."""
    return [greedy(context + proposal[:i]) for i in range(len(proposal) + 1)]


def verifier_only(prompt: Sequence[int], max_tokens: int, eos: int | None = None) -> list[int]:
    context, out = list(prompt), []
    while len(out) < max_tokens:
        token = greedy(context)
        out.append(token)
        context.append(token)
        if token == eos:
            break
    return out


def drafter(wrong_when: Callable[[int], bool]) -> Callable[..., Any]:
    """A draft model equal to greedy except where ``wrong_when(len(context))``."""

    async def draft(context: tuple[int, ...], n: int) -> list[int]:
        ctx, out = list(context), []
        for _ in range(n):
            token = greedy(ctx)
            if wrong_when(len(ctx)):
                token = (token + 1) % VOCAB
            out.append(token)
            ctx.append(token)
        return out

    return draft


# ------------------------------------------------------------------- the pure rule


def test_accept_draft_takes_the_matching_prefix_then_the_correction() -> None:
    assert accept_draft([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert accept_draft([5, 6, 7], [0, 6, 7, 1]) == [0]


def test_accept_draft_takes_the_bonus_token_when_all_are_accepted() -> None:
    assert accept_draft([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]
    assert accept_draft([], [4]) == [4]


def test_accept_draft_refuses_a_wrong_number_of_predictions() -> None:
    with pytest.raises(InvalidModelOutput):
        accept_draft([1, 2], [1, 2])


# -------------------------------------------------------------------- the decoder


@pytest.mark.parametrize(("name", "wrong_when"), [
    ("always right", lambda n: False),
    ("always wrong", lambda n: True),
    ("sometimes wrong", lambda n: n % 3 == 0),
])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("max_tokens", [1, 7, 24])
async def test_output_equals_verifier_only_greedy_decoding(
        name: str, wrong_when: Callable[[int], bool], k: int, max_tokens: int) -> None:
    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, drafter(wrong_when), verifier, k=k,
                                           max_tokens=max_tokens)
        result = await decoder.generate(PROMPT)
        assert list(result.tokens) == verifier_only(PROMPT, max_tokens)
        assert len(result.tokens) == max_tokens  # cut off exactly at max_tokens


async def test_all_accepted_rounds_take_the_bonus_token() -> None:
    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, drafter(lambda n: False), verifier, k=4,
                                           max_tokens=20)
        result = await decoder.generate(PROMPT)
        assert list(result.tokens) == verifier_only(PROMPT, 20)
        assert result.verifier_calls == 4  # 4 proposed + 1 bonus per call
        assert result.drafted == result.accepted == 16
        assert result.acceptance_rate == 1.0


async def test_a_wrong_draft_costs_one_verifier_call_per_token() -> None:
    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, drafter(lambda n: True), verifier, k=3,
                                           max_tokens=10)
        result = await decoder.generate(PROMPT)
        assert list(result.tokens) == verifier_only(PROMPT, 10)
        assert result.verifier_calls == 10 and result.accepted == 0
        stats = await decoder.stats()
        assert (stats.requests, stats.tokens, stats.verifier_calls) == (1, 10, 10)


async def test_max_tokens_per_request_and_eos_stop_decoding() -> None:
    reference = verifier_only(PROMPT, 30)
    eos = reference[5]
    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, drafter(lambda n: n % 4 == 0), verifier,
                                           k=3, max_tokens=30, eos=eos)
        result = await decoder.generate(PROMPT)
        assert list(result.tokens) == verifier_only(PROMPT, 30, eos=eos)
        assert result.tokens[-1] == eos and len(result.tokens) <= 6
        short = await decoder.generate(PROMPT, max_tokens=2)
        assert list(short.tokens) == reference[:2]
        with pytest.raises(InvalidArgument):
            await decoder.generate(PROMPT, max_tokens=0)


async def test_a_sync_draft_and_verifier_work_too() -> None:
    def draft(context: tuple[int, ...], n: int) -> list[int]:
        return [greedy(context)] * n

    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, draft, verifier, k=2, max_tokens=12)
        assert list((await decoder.generate(PROMPT)).tokens) == verifier_only(PROMPT, 12)


@pytest.mark.parametrize(("draft_out", "verifier_out"), [
    ([1, 2, 3, 4, 5], None),  # more tokens than asked for
    (["a"], None),  # not ints
    (None, [1]),  # too few predictions
    (None, "xyz"),  # not a sequence
])
async def test_bad_model_outputs_are_typed_errors(draft_out: Any, verifier_out: Any) -> None:
    async def draft(context: tuple[int, ...], n: int) -> Any:
        return draft_out if draft_out is not None else [greedy(context)] * n

    async def verify(context: tuple[int, ...], proposal: tuple[int, ...]) -> Any:
        return verifier_out if verifier_out is not None else verifier(context, proposal)

    async with ActorSystem("t") as system:
        decoder = SpeculativeDecoder.spawn(system, draft, verify, k=2, max_tokens=5)
        with pytest.raises(InvalidModelOutput):
            await decoder.generate(PROMPT)
        assert decoder.is_alive


async def test_bad_settings_and_a_stopped_decoder() -> None:
    async with ActorSystem("t") as system:
        for k, max_tokens in ((0, 5), (2, 0)):
            with pytest.raises(InvalidArgument):
                SpeculativeDecoder.spawn(system, drafter(lambda n: False), verifier, k=k,
                                         max_tokens=max_tokens)
        decoder = SpeculativeDecoder.spawn(system, drafter(lambda n: False), verifier, k=2,
                                           max_tokens=5)
        decoder.stop()
        with pytest.raises(ActorStopped):
            await decoder.generate(PROMPT)
