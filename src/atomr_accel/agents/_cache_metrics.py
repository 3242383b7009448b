"""The embedding caches' counters, and their Prometheus metrics when telemetry is on."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atomr_accel.telemetry import Telemetry

__all__ = ["CacheCounters", "CacheMetrics", "register"]


@dataclass(slots=True)
class CacheCounters:
    """One cache's counters, kept by its actor (they survive a restart of the actor)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserts: int = 0
    entries: int = 0


_COUNTERS = (("hits", "gets that found their key"), ("misses", "gets that did not"),
             ("evictions", "keys evicted as least recently used"),
             ("inserts", "embeddings inserted"))


class CacheMetrics:
    """A Prometheus collector of every registered cache of one system's telemetry.

    Counters ``atomr_accel_embedding_cache_{hits,misses,evictions,inserts}_total``
    and the gauge ``atomr_accel_embedding_cache_entries``, labelled by the
    cache actor's path. A stopped cache keeps its last values.
    """

    def __init__(self) -> None:
        self.caches: dict[str, CacheCounters] = {}

    def collect(self) -> Iterator[Any]:
        """Yield the metric families (called by the registry on each scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        caches = list(self.caches.items())
        for name, text in _COUNTERS:
            family = CounterMetricFamily(f"atomr_accel_embedding_cache_{name}",
                                         f"Embedding cache {text}.", labels=["cache"])
            for path, counters in caches:
                family.add_metric([path], getattr(counters, name))
            yield family
        gauge = GaugeMetricFamily("atomr_accel_embedding_cache_entries",
                                  "Keys held by an embedding cache.", labels=["cache"])
        for path, counters in caches:
            gauge.add_metric([path], counters.entries)
        yield gauge


_BY_TELEMETRY: weakref.WeakKeyDictionary[Telemetry, CacheMetrics] = weakref.WeakKeyDictionary()


def register(telemetry: Telemetry | None, path: str, counters: CacheCounters) -> None:
    """Report ``counters`` as the cache ``path`` in ``telemetry``'s registry (if enabled)."""
    if telemetry is None:
        return
    metrics = _BY_TELEMETRY.get(telemetry)
    if metrics is None:
        metrics = _BY_TELEMETRY[telemetry] = CacheMetrics()
        telemetry.registry.register(metrics)
    metrics.caches[path] = counters
