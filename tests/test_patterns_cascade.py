"""InferenceCascade: the first confident stage answers; stage errors; stage supervision."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from atomr_accel import ActorStopped, InvalidArgument
from atomr_accel.actor import ActorSystem
from atomr_accel.patterns import (
    CascadeResult,
    InferenceCascade,
    InvalidModelOutput,
    Reloadable,
    Stage,
)

pytestmark = pytest.mark.anyio


class Model:
    """A stage model: returns ``(name:x, confidence(x))`` and records each call."""

    def __init__(self, name: str, confidence: dict[int, float], default: float = 0.0) -> None:
        self.name = name
        self.confidence = confidence
        self.default = default
        self.calls: list[int] = []

    async def __call__(self, x: int) -> tuple[str, float]:
        self.calls.append(x)
        if x < 0:
            raise ValueError(f"{self.name} cannot take {x}")
        return f"{self.name}:{x}", self.confidence.get(x, self.default)


async def test_the_first_stage_meeting_its_threshold_answers() -> None:
    fast = Model("fast", {1: 0.95, 2: 0.5, 3: 0.5})
    mid = Model("mid", {2: 0.8, 3: 0.79})
    slow = Model("slow", {}, default=0.1)
    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(system, [Stage(fast, 0.9), Stage(mid, 0.8),
                                                  Stage(slow)])
        assert await cascade.infer(1) == CascadeResult("fast:1", 0.95, 0)
        assert await cascade.infer(2) == CascadeResult("mid:2", 0.8, 1)  # >= threshold
        assert await cascade.infer(3) == CascadeResult("slow:3", 0.1, 2)  # last stage answers
        assert (fast.calls, mid.calls, slow.calls) == ([1, 2, 3], [2, 3], [3])
        stats = await cascade.stats()
        assert stats.answered_by == (1, 1, 1) and stats.failed == 0


async def test_sync_and_async_stages_mix_and_requests_run_concurrently() -> None:
    def cheap(x: int) -> tuple[int, float]:
        return x, 1.0 if x % 2 else 0.0

    async def strong(x: int) -> tuple[int, float]:
        await asyncio.sleep(0)
        return x * 100, 0.99

    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(system, [Stage(cheap, 0.5), Stage(strong)])
        results = await asyncio.gather(*(cascade.infer(i) for i in range(20)))
        assert [r.answer for r in results] == [i if i % 2 else i * 100 for i in range(20)]
        assert [r.stage for r in results] == [1 - i % 2 for i in range(20)]


async def test_a_stage_error_fails_the_request_and_the_stage_is_restarted() -> None:
    fast = Model("fast", {}, default=0.0)
    mid = Model("mid", {}, default=0.99)
    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(
            system, [Stage(fast, 0.9), Stage(mid, 0.9), Stage(Model("slow", {}))])
        with pytest.raises(ValueError, match="fast cannot take -1"):
            await cascade.infer(-1)
        assert mid.calls == []  # the failed request went no further
        assert (await cascade.infer(5)).answer == "mid:5"  # the restarted stage serves again
        assert fast.calls == [-1, 5]
        stats = await cascade.stats()
        assert stats.failed == 1 and stats.restarts == (1, 0, 0)
        assert stats.answered_by == (0, 1, 0)


async def test_a_failing_middle_stage_is_reloaded() -> None:
    loads: list[str] = []

    async def mid_model(x: int) -> tuple[str, float]:
        if x == 13:
            raise RuntimeError("unlucky")
        return f"mid:{x}", 1.0

    def load() -> Any:
        loads.append("load")
        return mid_model

    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(
            system, [Stage(Model("fast", {}), 0.5), Stage(Reloadable(load), 0.5),
                     Stage(Model("slow", {}))])
        with pytest.raises(RuntimeError, match="unlucky"):
            await cascade.infer(13)
        assert (await cascade.infer(7)).answer == "mid:7"
        assert loads == ["load", "load"]  # loaded at start and again on restart
        assert (await cascade.stats()).restarts == (0, 1, 0)


async def test_a_stage_past_its_restart_budget_stops_and_requests_fail_typed() -> None:
    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(system, [Stage(Model("only", {}))], max_restarts=0)
        with pytest.raises(ValueError):
            await cascade.infer(-1)
        with pytest.raises(ActorStopped):
            await cascade.infer(1)


@pytest.mark.parametrize("output", ["plain", ("a", "high"), ("a", True), ("a", 1.0, 2), None])
async def test_a_bad_stage_output_is_a_typed_error(output: Any) -> None:
    async def stage(x: int) -> Any:
        return output

    async with ActorSystem("t") as system:
        cascade = InferenceCascade.spawn(system, [Stage(stage)])
        with pytest.raises(InvalidModelOutput):
            await cascade.infer(1)
        assert (await cascade.stats()).failed == 1


@pytest.mark.parametrize("stages", [
    [], [Stage(Model("a", {})), Stage(Model("b", {}))],  # a non-last stage without threshold
    [Stage(Model("a", {}), float("nan")), Stage(Model("b", {}))],
    ["not a stage"], [Stage("not callable")],  # type: ignore[arg-type]
])
async def test_bad_cascades_are_refused(stages: list[Any]) -> None:
    async with ActorSystem("t") as system:
        with pytest.raises(InvalidArgument):
            InferenceCascade.spawn(system, stages)
