"""InferenceCascade: cheap models first, a stronger one only when they are unsure."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Props, Reply
from atomr_accel.blueprint import BlueprintClient, SystemLike, twins_with_old_name
from atomr_accel.blueprint._actor import GetStats, Serve
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.patterns._errors import InvalidModelOutput
from atomr_accel.patterns._worker import ModelSpec, WorkerParent, check_model

__all__ = ["CascadeResult", "CascadeStats", "InferenceCascade", "Stage"]


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage: ``model(x)`` returns ``(answer, confidence)``.

    The stage answers when ``confidence >= threshold``; the last stage always
    answers and takes no threshold.
    """

    model: ModelSpec
    threshold: float | None = None


@dataclass(frozen=True, slots=True)
class CascadeResult:
    """The answer, its confidence and the index of the stage that gave it."""

    answer: Any
    confidence: float
    stage: int


@dataclass(frozen=True, slots=True)
class CascadeStats:
    """How many requests each stage answered, how many failed, and stage restarts."""

    answered_by: tuple[int, ...]
    failed: int
    restarts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Finished:
    stage: int | None  # None: failed


def _stage_output(out: Any, stage: int) -> tuple[Any, float]:
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise InvalidModelOutput(
            f"stage {stage} returned {type(out).__name__}; a stage returns (answer, confidence)")
    answer, confidence = out
    if not isinstance(confidence, numbers.Real) or isinstance(confidence, bool):
        raise InvalidModelOutput(
            f"stage {stage} returned confidence {confidence!r}; it must be a real number")
    return answer, float(confidence)


class _CascadeActor(WorkerParent):
    def __init__(self, stages: Sequence[Stage], max_restarts: int | None,
                 within: float | None) -> None:
        super().__init__("stage", [s.model for s in stages], max_restarts, within)
        self.thresholds = [s.threshold for s in stages]
        self.answered_by = [0] * len(stages)
        self.failed = 0

    async def serve(self, message: Any) -> Any:
        """Handle requests, finished requests and stats."""
        cls = type(message)
        if cls is Serve:
            self.start_task(self._infer(message.x, self.context.defer_reply()))
        elif cls is _Finished:
            if message.stage is None:
                self.failed += 1
            else:
                self.answered_by[message.stage] += 1
        elif cls is GetStats:
            return CascadeStats(tuple(self.answered_by), self.failed, tuple(self.restarts))
        else:
            self.unhandled(message)
        return None

    async def _infer(self, x: Any, reply: Reply) -> None:
        if not await self.answer(reply, self._cascade(x, reply)):
            self.context.self_ref.tell(_Finished(None))

    async def _cascade(self, x: Any, reply: Reply) -> CascadeResult | None:
        """The answering stage's result (told to this actor too); None once the caller
        has given up, as nothing more is spent on it."""
        last = len(self.workers) - 1
        stage = 0
        while not reply.done():
            answer, confidence = _stage_output(await self.ask_worker(stage, x), stage)
            threshold = self.thresholds[stage]
            if stage == last or (threshold is not None and confidence >= threshold):
                self.context.self_ref.tell(_Finished(stage))
                return CascadeResult(answer, confidence, stage)
            stage += 1
        return None


class InferenceCascade(BlueprintClient):
    """Ask the stages in order; the first whose confidence meets its threshold answers.

    Each stage's model runs in its own child actor (``stage-0``, ...),
    supervised: a model that raises fails that request with the same
    exception and its actor is restarted (at most ``max_restarts`` times in
    ``within`` seconds; past that the stage stops and requests fail with
    ``ActorStopped``). A stage returning anything but ``(answer, confidence)``
    with a real confidence fails the request with ``InvalidModelOutput``. If no
    earlier stage is confident enough the last stage answers. Requests run
    concurrently; each stage takes one call at a time.
    """

    @staticmethod
    def props(stages: Sequence[Stage], *, max_restarts: int | None = 10,
              within: float | None = 60.0) -> Props:
        """Props for the cascade actor (arguments as in ``spawn``); checks them now."""
        stages = list(stages)
        if not stages:
            raise InvalidArgument("a cascade needs at least one stage")
        for i, stage in enumerate(stages):
            if not isinstance(stage, Stage):
                raise InvalidArgument(f"stage {i} must be a Stage, got {stage!r}")
            check_model(f"stage {i}", stage.model)
            t = stage.threshold
            if i < len(stages) - 1 and (not isinstance(t, int | float) or isinstance(t, bool)
                                        or not math.isfinite(t)):
                raise InvalidArgument(f"stage {i} needs a finite threshold, got {t!r}")
        return Props(_CascadeActor, stages, max_restarts, within)

    @classmethod
    def spawn(cls, system: SystemLike, stages: Sequence[Stage], *,
              max_restarts: int | None = 10, within: float | None = 60.0,
              name: str | None = None) -> InferenceCascade:
        """Start an InferenceCascade in ``system`` and return its client.

        ``spawn(system, stages, *, max_restarts=10, within=60.0, name=None)``
        runs ``stages`` and returns this class's client. Raises
        ``InvalidArgument`` for a bad setting."""
        props = cls.props(stages, max_restarts=max_restarts, within=within)
        return cls._start(system, props, name)

    async def infer_async(self, x: Any, *, timeout_secs: float | None = None) -> CascadeResult:
        """Run ``x`` through the cascade; return the answering stage's result.

        Raises what a stage raised, ``InvalidModelOutput``, ``AskTimeout`` or
        ``ActorStopped``.
        """
        result: CascadeResult = await self._ask(Serve(x), timeout_secs)
        return result

    async def stats_async(self, *, timeout_secs: float | None = None) -> CascadeStats:
        """Answers per stage, failures and restarts per stage."""
        stats: CascadeStats = await self._ask(GetStats(), timeout_secs)
        return stats

    infer, infer_blocking = twins_with_old_name(infer_async)
    stats, stats_blocking = twins_with_old_name(stats_async)
