"""The original package's demo models of the seven serving blueprints.

The original package (``atomr_accel`` 0.10, built with PyO3) offered each
serving blueprint on built-in demo models only. They are async functions, so
they run on the event loop:

* echo: a payload's bytes as a list of ints (batching, replica pool, scheduler,
  and the cascade's one stage, at confidence 1.0);
* ``VersionTag``: the echo plus one byte, the model's generation (0, then 1, 2, ...
  per swap);
* ``draft_next`` proposes ``last+1 ... last+k``; ``verify_next`` (greedy rule
  ``last + 1``) accepts all of it;
* ``BiasExpert(i)`` adds ``i``; ``LinearGate`` scores expert ``i`` with ``i``, so
  the last expert wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BiasExpert", "LinearGate", "VersionTag", "draft_next", "echo", "echo_batch",
           "echo_stage", "verify_next"]

Array = np.ndarray[Any, Any]


async def echo_batch(payloads: list[bytes]) -> list[list[int]]:
    """The original's echo batch function: each payload's bytes as a list of ints."""
    return [list(payload) for payload in payloads]


async def echo(payload: bytes) -> list[int]:
    """The original's echo model: the payload's bytes as a list of ints."""
    return list(payload)


async def echo_stage(payload: bytes) -> tuple[list[int], float]:
    """The original's one cascade stage: the echo, with confidence 1.0."""
    return list(payload), 1.0


@dataclass(frozen=True, slots=True)
class VersionTag:
    """The original's hot-swap model: the echo plus one byte, ``generation % 256``."""

    generation: int

    async def __call__(self, payload: bytes) -> list[int]:
        """Return the payload's bytes and the generation byte."""
        return [*payload, self.generation % 256]


async def draft_next(context: tuple[int, ...], n: int) -> list[int]:
    """The original's draft: ``last+1 ... last+n`` after the context's last token (0 if none)."""
    last = context[-1] if context else 0
    return list(range(last + 1, last + n + 1))


async def verify_next(context: tuple[int, ...], proposal: tuple[int, ...]) -> list[int]:
    """A verifier whose greedy token is the previous one + 1: it accepts all ``draft_next`` says.

    Returns its choice after ``context + proposal[:i]`` for each ``i`` (the
    original's verifier accepted every proposal).
    """
    seq = [*context, *proposal]
    start = len(context)
    return [(seq[start + i - 1] if start + i else 0) + 1 for i in range(len(proposal) + 1)]


@dataclass(frozen=True, slots=True)
class LinearGate:
    """The original's gate: every token scores expert ``i`` with ``i`` (the last one wins)."""

    n_experts: int

    async def __call__(self, rows: Array) -> Array:
        """Return the ``tokens x experts`` scores."""
        return np.tile(np.arange(self.n_experts, dtype=np.float64), (len(rows), 1))


@dataclass(frozen=True, slots=True)
class BiasExpert:
    """The original's expert: adds ``bias`` to every feature."""

    bias: float

    async def __call__(self, rows: Array) -> Array:
        """Return ``rows + bias``."""
        return np.asarray(rows, dtype=np.float64) + self.bias
