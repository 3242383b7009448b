"""The parameter server's staleness rule and its counters: plain decisions, no I/O.

A gradient computed against version ``w`` reaches a server at version ``v``;
its staleness is ``s = v - w`` (a ``w`` above ``v`` is an ``InvalidArgument``:
no worker can have seen a version the server has not made yet).

* ``s == 0``: applied at full weight.
* ``0 < s <= max_staleness``: applied down-weighted by ``1 / (1 + s)``.
* ``s > max_staleness``: rejected with ``StaleGradient``; the weights and the
  version stay as they were and the rejection is counted.

``avg_staleness`` (the fourth field of ``stats()``, as in the original) is the
mean ``s`` of the last 128 *applied* gradients (0.0 before the first).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from atomr_accel.core._errors import GpuRuntimeError, InvalidArgument

__all__ = ["STALENESS_WINDOW", "StaleGradient", "StalenessCounters", "staleness_weight"]

STALENESS_WINDOW = 128
"""How many applied gradients ``avg_staleness`` averages over (the original's window)."""


class StaleGradient(GpuRuntimeError):
    """A pushed gradient was more than ``max_staleness`` versions behind the server.

    ``staleness`` is ``version - worker_version``, ``max_staleness`` the
    server's bound; the gradient was not applied. Pull the weights again and
    recompute it.
    """

    def __init__(self, staleness: int, max_staleness: int) -> None:
        super().__init__(f"parameter server: staleness {staleness} > max {max_staleness}; "
                         f"the gradient was not applied (pull the weights again)")
        self.staleness = staleness
        self.max_staleness = max_staleness


def staleness_weight(version: int, worker_version: int, max_staleness: int) -> tuple[int, float]:
    """``(s, weight)`` for a gradient of ``worker_version`` reaching a server at ``version``.

    ``weight`` is ``1 / (1 + s)``. Raises ``StaleGradient`` when
    ``s > max_staleness`` and ``InvalidArgument`` when ``worker_version`` is
    newer than ``version``.
    """
    if worker_version > version:
        raise InvalidArgument(f"worker_version {worker_version} is newer than the server's "
                              f"version {version}")
    staleness = version - worker_version
    if staleness > max_staleness:
        raise StaleGradient(staleness, max_staleness)
    return staleness, 1.0 / (1.0 + staleness)


@dataclass
class StalenessCounters:
    """What the server counts: versions, applied, rejected and down-weighted gradients,
    pulls, and the staleness of the last ``STALENESS_WINDOW`` applied gradients."""

    version: int = 0
    gradients_applied: int = 0
    gradients_rejected: int = 0
    gradients_downweighted: int = 0
    weights_pulled: int = 0

    def __post_init__(self) -> None:
        self.window: deque[int] = deque(maxlen=STALENESS_WINDOW)

    def applied(self, staleness: int) -> int:
        """Count an applied gradient of ``staleness``; return the new version."""
        self.version += 1
        self.gradients_applied += 1
        self.gradients_downweighted += staleness > 0
        self.window.append(staleness)
        return self.version

    @property
    def avg_staleness(self) -> float:
        """Mean staleness of the last ``STALENESS_WINDOW`` applied gradients (0.0: none)."""
        return sum(self.window) / len(self.window) if self.window else 0.0
