"""Find the requests of a batch that took its device's context down, on the new context.

A batch run by a ``DeviceFunction`` that fails with ``ContextPoisoned`` (a sticky
CUDA fault, or a worker that died under it: ``WorkerLost``) says nothing of which
of its items caused it. Failing the whole batch would let one bad input take its
batch-mates down, so the batch is run again, once the device serves again, in
groups of about ``sqrt(n)`` items, and the items of a group that fails the same
way are run one at a time: each poisoning item costs three context losses at
most (the batch, its group, itself), whatever the batch size, and the others
get their results. The device's restart budget must allow for that
(``spawn_device(max_restarts=...)``). The calls go through the ``run`` it is given.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

from atomr_accel.core._errors import ContextPoisoned

__all__ = ["Outcome", "isolate"]

Outcome = tuple[bool, Any]
"""``(True, value)`` or ``(False, error)`` for one item."""

RunBatch = Callable[[list[Any]], Awaitable[list[Any]]]
"""Runs a batch and returns one value per item (raises as the batch function did)."""


def group_size(n: int) -> int:
    """How many items each group of a batch of ``n`` holds: ``ceil(sqrt(n))``."""
    return max(1, math.isqrt(n - 1) + 1) if n > 1 else 1


async def isolate(run: RunBatch, items: list[Any]) -> list[Outcome]:
    """Run ``items`` again in groups, then the items of a poisoned group one by one; one
    outcome per item, in order. An error other than ``ContextPoisoned`` answers the items
    of the call that raised it."""
    outcomes: list[Outcome] = []
    size = group_size(len(items))
    for start in range(0, len(items), size):
        group = items[start:start + size]
        try:
            outcomes.extend(await _outcomes(run, group))
            continue
        except ContextPoisoned as exc:
            if len(group) == 1:
                outcomes.append((False, exc))
                continue
        for item in group:
            try:
                outcomes.extend(await _outcomes(run, [item]))
            except ContextPoisoned as exc:
                outcomes.append((False, exc))
    return outcomes


async def _outcomes(run: RunBatch, group: list[Any]) -> list[Outcome]:
    """The outcomes of ``group`` run as one batch; raises ``ContextPoisoned`` when the
    run took the context down (any other error answers every item of the group)."""
    try:
        values = await run(group)
    except ContextPoisoned:
        raise
    except Exception as exc:
        return [(False, exc)] * len(group)
    return [(True, value) for value in values]
