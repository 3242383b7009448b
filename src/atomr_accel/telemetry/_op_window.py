"""Op rates and latency percentiles per library, over a sliding window of metric readings."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atomr_accel.telemetry._metrics import LATENCY_BUCKETS, OpMetrics

__all__ = ["LibraryReading", "OpWindow", "bucket_quantile"]


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]
                    ) -> float | None:
    """The ``q`` quantile of a histogram, as Prometheus' ``histogram_quantile`` estimates it.

    ``bounds`` are the buckets' upper bounds (the last ``inf``), ``cumulative``
    the count of observations at or below each. Linear within the bucket the
    quantile falls in; the highest finite bound when it falls in the ``inf``
    bucket; None with no observations.
    """
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    below, lower = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        below, lower = count, bound
    return lower


@dataclass(frozen=True, slots=True)
class LibraryReading:
    """Cumulative figures of one library (summed over devices) at one moment."""

    ops: float
    errors: float
    in_flight: float
    buckets: tuple[float, ...]
    """Cumulative observation counts per ``LATENCY_BUCKETS`` bound."""


def read(metrics: OpMetrics) -> dict[str, LibraryReading]:
    """The current cumulative figures of every library ``metrics`` has seen."""
    ops: dict[str, float] = {}
    errors: dict[str, float] = {}
    in_flight: dict[str, float] = {}
    buckets: dict[str, list[float]] = {}
    index = {bound: i for i, bound in enumerate(LATENCY_BUCKETS)}
    for family in metrics.ops.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                library = sample.labels["library"]
                ops[library] = ops.get(library, 0.0) + sample.value
                if sample.labels["outcome"] != "ok":
                    errors[library] = errors.get(library, 0.0) + sample.value
    for family in metrics.in_flight.collect():
        for sample in family.samples:
            library = sample.labels["library"]
            in_flight[library] = in_flight.get(library, 0.0) + sample.value
    for family in metrics.latency.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                library = sample.labels["library"]
                counts = buckets.setdefault(library, [0.0] * len(LATENCY_BUCKETS))
                counts[index[float(sample.labels["le"])]] += sample.value
    return {library: LibraryReading(ops.get(library, 0.0), errors.get(library, 0.0),
                                    in_flight.get(library, 0.0),
                                    tuple(buckets.get(library, [0.0] * len(LATENCY_BUCKETS))))
            for library in sorted(set(ops) | set(in_flight) | set(buckets))}


class OpWindow:
    """Per-library op rates and latency percentiles over the last ``window`` seconds.

    Each ``summary()`` reads the op metrics and keeps the reading; rates and
    percentiles come from the difference between now and the oldest reading
    within ``window`` seconds (the whole history until one is that old).
    """

    def __init__(self, metrics: OpMetrics, window: float = 10.0) -> None:
        self.metrics = metrics
        self.window = window
        self._history: deque[tuple[float, dict[str, LibraryReading]]] = deque()

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per library: ``ops_total``, ``errors_total``, ``in_flight``, ``rate_per_s``
        (ops answered per second over the window) and ``p50_s``, ``p95_s``,
        ``p99_s`` (latency in seconds of the ops answered in the window, None
        when there were none)."""
        now = time.monotonic()
        current = read(self.metrics)
        while len(self._history) > 1 and now - self._history[1][0] >= self.window:
            self._history.popleft()
        then, before = self._history[0] if self._history else (now, {})
        self._history.append((now, current))
        elapsed = now - then
        summary: dict[str, dict[str, Any]] = {}
        for library, reading in current.items():
            old = before.get(library)
            answered = reading.ops - (old.ops if old else 0.0)
            window = tuple(c - (old.buckets[i] if old else 0.0)
                           for i, c in enumerate(reading.buckets))
            summary[library] = {
                "ops_total": int(reading.ops),
                "errors_total": int(reading.errors),
                "in_flight": int(reading.in_flight),
                "rate_per_s": answered / elapsed if elapsed > 0 else 0.0,
                **{f"p{round(q * 100)}_s": bucket_quantile(q, LATENCY_BUCKETS, window)
                   for q in (0.5, 0.95, 0.99)},
            }
        return summary
