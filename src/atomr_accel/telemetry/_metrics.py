"""Prometheus metrics of devices: op counters and latencies (live) and device gauges (sampled)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from atomr_accel.core._errors import OutOfMemory
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Allocate, Free
from atomr_accel.device import DeviceStats, Status
from atomr_accel.device._world import WorldState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

__all__ = ["LATENCY_BUCKETS", "DeviceCollector", "OpMetrics", "WorldCollector"]

LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))
"""Op latency histogram buckets, in seconds: 10 µs to 10 s."""


_DEVICE_FIGURES: tuple[tuple[str, str, str, Callable[[DeviceStats], float | None]], ...] = (
    ("gauge", "atomr_device_ready", "1 when the device is serving.",
     lambda s: 1.0 if s.status is Status.READY else 0.0),
    ("gauge", "atomr_device_generation", "Context generation.", lambda s: s.generation),
    ("counter", "atomr_device_restarts", "Context rebuilds.", lambda s: s.restarts),
    ("gauge", "atomr_device_queue_depth", "Requests queued while the context (re)builds.",
     lambda s: s.queue_depth),
    ("gauge", "atomr_device_in_flight", "Requests sent to the context.", lambda s: s.in_flight),
    ("gauge", "atomr_device_bytes_allocated", "Bytes held by live buffers.",
     lambda s: s.bytes_allocated),
    ("gauge", "atomr_device_memory_free_bytes", "Free device memory.", lambda s: s.memory_free),
    ("gauge", "atomr_device_memory_total_bytes", "Total device memory.",
     lambda s: s.memory_total),
    ("counter", "atomr_device_reruns", "Requests run again after their context died under them.",
     lambda s: s.reruns),
    ("counter", "atomr_device_standby_switches",
     "Rebuilds that switched to the warm standby context.",
     lambda s: None if s.standby_ready is None else s.standby_switches),
    ("gauge", "atomr_device_standby_switch_seconds",
     "How long the last standby switch waited for the standby.",
     lambda s: None if s.standby_switch_ms is None else s.standby_switch_ms / 1e3),
    ("gauge", "atomr_device_standby_ready", "1 while a started standby context waits.",
     lambda s: None if s.standby_ready is None else float(s.standby_ready)),
)
"""``DeviceCollector``'s families: kind (gauge or counter), name, help, and a device's
figure in its ``DeviceStats`` (None: the device has no sample in that family)."""


class OpMetrics:
    """An ``OpObserver`` that counts and times every op per device and library.

    Metrics (labels ``device``, ``library``): ``atomr_ops_total`` (also
    ``outcome``: ``ok`` or the error's class name), ``atomr_ops_in_flight``,
    ``atomr_op_latency_seconds``; per ``device``: ``atomr_allocations_total``,
    ``atomr_allocated_bytes_total``, ``atomr_frees_total``,
    ``atomr_out_of_memory_total``. Runs on the event loop; label children are
    cached so an op costs a few dictionary look-ups.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.ops = Counter("atomr_ops", "Ops answered, by outcome (ok or the error class).",
                           ["device", "library", "outcome"], registry=registry)
        self.in_flight = Gauge("atomr_ops_in_flight", "Ops sent to a context and not answered.",
                               ["device", "library"], registry=registry)
        self.latency = Histogram("atomr_op_latency_seconds",
                                 "Time from sending an op to a context to its answer.",
                                 ["device", "library"], registry=registry,
                                 buckets=LATENCY_BUCKETS)
        self.allocations = Counter("atomr_allocations", "Buffers allocated.", ["device"],
                                   registry=registry)
        self.allocated_bytes = Counter("atomr_allocated_bytes", "Bytes allocated.", ["device"],
                                       registry=registry)
        self.frees = Counter("atomr_frees", "Buffers freed.", ["device"], registry=registry)
        self.out_of_memory = Counter("atomr_out_of_memory", "Ops failed with OutOfMemory.",
                                     ["device"], registry=registry)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._outcomes: dict[tuple[str, str, str], Any] = {}

    def _pair(self, device: str, library: str) -> tuple[Any, Any]:
        pair = self._children.get((device, library))
        if pair is None:
            pair = (self.in_flight.labels(device, library), self.latency.labels(device, library))
            self._children[(device, library)] = pair
        return pair

    def op_started(self, device: str, op: Op) -> None:
        """Count ``op`` in flight."""
        self._pair(device, op.library)[0].inc()

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        """Count ``op`` answered, observe its latency, and count allocations and OOMs."""
        library = op.library
        in_flight, latency = self._pair(device, library)
        in_flight.dec()
        latency.observe(seconds)
        outcome = "ok" if error is None else type(error).__name__
        key = (device, library, outcome)
        counter = self._outcomes.get(key)
        if counter is None:
            counter = self._outcomes[key] = self.ops.labels(device, library, outcome)
        counter.inc()
        if error is None:
            if isinstance(op, Allocate):
                self.allocations.labels(device).inc()
                self.allocated_bytes.labels(device).inc(op.length * op.dtype.itemsize)
            elif isinstance(op, Free):
                self.frees.labels(device).inc()
        elif isinstance(error, OutOfMemory):
            self.out_of_memory.labels(device).inc()


class DeviceCollector:
    """A Prometheus collector of the last ``DeviceStats`` sampled from each device.

    Metrics (label ``device``): ``atomr_device_ready`` (1 when serving),
    ``atomr_device_generation``, ``atomr_device_restarts_total``,
    ``atomr_device_queue_depth``, ``atomr_device_in_flight``,
    ``atomr_device_bytes_allocated``, ``atomr_device_memory_free_bytes``,
    ``atomr_device_memory_total_bytes``, ``atomr_device_reruns_total`` (requests run
    again after their context died), ``atomr_device_standby_switches_total``,
    ``atomr_device_standby_switch_seconds`` (the last switch's wait) and
    ``atomr_device_standby_ready`` (devices with a standby only). Collected on the
    scraping thread from the last snapshot, never by asking a device.
    """

    def __init__(self) -> None:
        self.snapshot: dict[str, DeviceStats] = {}

    def update(self, device: str, stats: DeviceStats) -> None:
        """Replace the snapshot of ``device``."""
        self.snapshot = {**self.snapshot, device: stats}

    def collect(self) -> Iterator[Metric]:
        """Yield one family per figure, one sample per device."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        kinds = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}
        snapshot = self.snapshot
        for kind, name, documentation, value in _DEVICE_FIGURES:
            family = kinds[kind](name, documentation, labels=["device"])
            for device, stats in snapshot.items():
                figure = value(stats)
                if figure is not None:
                    family.add_metric([device], float(figure))
            yield family


class WorldCollector:
    """A Prometheus collector of the communicator worlds (``System.nccl_world``).

    Metrics (label ``world``): ``atomr_world_ready`` (1 when serving),
    ``atomr_world_epoch`` (the communicator generation),
    ``atomr_world_rebuilds_total``, ``atomr_world_aborted_total`` (collectives
    that failed); labels ``world`` and ``kind`` (``all_reduce``, ...):
    ``atomr_world_collectives_total`` and ``atomr_world_bytes_total`` (bytes the
    ranks sent). Read from the worlds' state on the scraping thread.
    """

    def __init__(self) -> None:
        self.worlds: tuple[WorldState, ...] = ()

    def add(self, world: WorldState) -> None:
        """Collect ``world`` from now on."""
        if world not in self.worlds:
            self.worlds = (*self.worlds, world)

    def collect(self) -> Iterator[Metric]:
        """Yield one family per figure, one sample per world (and kind)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        worlds = self.worlds
        ready = GaugeMetricFamily("atomr_world_ready", "1 when the world serves.",
                                  labels=["world"])
        epoch = GaugeMetricFamily("atomr_world_epoch", "Communicator generation.",
                                  labels=["world"])
        rebuilds = CounterMetricFamily("atomr_world_rebuilds", "Communicator rebuilds.",
                                       labels=["world"])
        aborted = CounterMetricFamily("atomr_world_aborted", "Collectives that failed.",
                                      labels=["world"])
        calls = CounterMetricFamily("atomr_world_collectives", "Collectives completed.",
                                    labels=["world", "kind"])
        moved = CounterMetricFamily("atomr_world_bytes", "Bytes the ranks sent.",
                                    labels=["world", "kind"])
        for world in worlds:
            ready.add_metric([world.name], 1.0 if world.status == "ready" else 0.0)
            epoch.add_metric([world.name], float(world.epoch))
            rebuilds.add_metric([world.name], float(world.rebuilds))
            aborted.add_metric([world.name], float(world.aborted))
            for kind, count in dict(world.calls).items():
                calls.add_metric([world.name, kind], float(count))
            for kind, nbytes in dict(world.bytes_moved).items():
                moved.add_metric([world.name, kind], float(nbytes))
        yield from (ready, epoch, rebuilds, aborted, calls, moved)
