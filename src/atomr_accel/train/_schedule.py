"""Pipeline schedules: which forward and backward passes each stage runs, in what order.

Plain decisions, no I/O. A schedule is, for each stage, a list of ``Pass``es
(``("F", i)``: forward of micro-batch ``i``; ``("B", i)``: its backward).
Stage ``s`` may run ``F i`` once stage ``s-1`` has run ``F i`` (its
activation arrived) and ``B i`` once stage ``s+1`` has run ``B i`` (its
gradient arrived; the last stage needs only its own ``F i``, which computes
the loss too).

* ``"gpipe"``: every forward, then every backward (in reverse order, as GPipe):
  ``m`` micro-batches' activations are kept on each stage at once.
* ``"1f1b"`` (PipeDream-flush): stage ``s`` of ``S`` runs ``min(S-s-1, m)``
  warm-up forwards, then alternates one forward and one backward, then runs the
  remaining backwards; at most ``S - s`` micro-batches' activations are kept.

``simulate`` runs a schedule with those dependencies and returns the order the
passes complete in (one pass a stage at a time); it raises ``RuntimeError`` on
a deadlock. Both schedules complete for every ``S >= 1`` and ``m >= 1``.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["SCHEDULES", "Pass", "schedule", "simulate", "stage_schedule"]

Pass = tuple[Literal["F", "B"], int]
"""One pass of a stage: ``("F", i)`` or ``("B", i)`` for micro-batch ``i``."""

SCHEDULES = ("1f1b", "gpipe")
"""The schedule names ``PipelineParallelTrainer`` accepts."""


def stage_schedule(kind: str, stage: int, n_stages: int, micro_batches: int) -> list[Pass]:
    """The passes of ``stage`` (0-based) of ``n_stages`` for ``micro_batches`` under ``kind``."""
    m = micro_batches
    forwards: list[Pass] = [("F", i) for i in range(m)]
    if kind == "gpipe":
        return forwards + [("B", i) for i in reversed(range(m))]
    if kind != "1f1b":
        raise ValueError(f"unknown schedule {kind!r}")
    warmup = min(n_stages - stage - 1, m)
    passes: list[Pass] = forwards[:warmup]
    for i in range(warmup, m):
        passes += [("F", i), ("B", i - warmup)]
    passes += [("B", i) for i in range(m - warmup, m)]
    return passes


def schedule(kind: str, n_stages: int, micro_batches: int) -> list[list[Pass]]:
    """Every stage's passes (``stage_schedule`` for each)."""
    return [stage_schedule(kind, s, n_stages, micro_batches) for s in range(n_stages)]


def _ready(done: set[tuple[int, Pass]], stage: int, step: Pass, n_stages: int) -> bool:
    kind, i = step
    if kind == "F":
        return stage == 0 or (stage - 1, ("F", i)) in done
    if stage == n_stages - 1:
        return (stage, ("F", i)) in done
    return (stage + 1, ("B", i)) in done


def simulate(plan: list[list[Pass]]) -> list[tuple[int, Pass]]:
    """Run ``plan`` in rounds (each stage runs its next pass when its input is there);
    return ``(stage, pass)`` in completion order. ``RuntimeError`` on a deadlock."""
    n = len(plan)
    position = [0] * n
    done: set[tuple[int, Pass]] = set()
    order: list[tuple[int, Pass]] = []
    while any(position[s] < len(plan[s]) for s in range(n)):
        runnable = [s for s in range(n) if position[s] < len(plan[s])
                    and _ready(done, s, plan[s][position[s]], n)]
        if not runnable:
            stuck = {s: plan[s][position[s]] for s in range(n) if position[s] < len(plan[s])}
            raise RuntimeError(f"pipeline schedule deadlocks waiting on {stuck}")
        for s in runnable:
            done.add((s, plan[s][position[s]]))
            order.append((s, plan[s][position[s]]))
            position[s] += 1
    return order
