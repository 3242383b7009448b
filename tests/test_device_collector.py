"""``DeviceCollector``: each family's kind, name and sample per device, standby ones only for a
device with a standby, read from the last snapshot alone."""

from __future__ import annotations

import dataclasses

import pytest

from atomr_accel.device import DeviceStats, Status
from atomr_accel.telemetry._metrics import DeviceCollector

pytest.importorskip("prometheus_client")

PLAIN = DeviceStats(
    device_id=0, backend="cpu", isolation="thread", status=Status.READY, generation=3,
    restarts=2, in_flight=5, queue_depth=7, completed=11, failed=1, out_of_memory=0,
    host_pid=None, bytes_allocated=400, memory_free=600, memory_total=1000, reruns=4)
SPARE = dataclasses.replace(PLAIN, status=Status.REBUILDING, standby_ready=True,
                            standby_switches=6, standby_switch_ms=250.0)

FAMILIES = [
    ("atomr_device_ready", "gauge", 1.0, 0.0),
    ("atomr_device_generation", "gauge", 3.0, 3.0),
    ("atomr_device_restarts", "counter", 2.0, 2.0),
    ("atomr_device_queue_depth", "gauge", 7.0, 7.0),
    ("atomr_device_in_flight", "gauge", 5.0, 5.0),
    ("atomr_device_bytes_allocated", "gauge", 400.0, 400.0),
    ("atomr_device_memory_free_bytes", "gauge", 600.0, 600.0),
    ("atomr_device_memory_total_bytes", "gauge", 1000.0, 1000.0),
    ("atomr_device_reruns", "counter", 4.0, 4.0),
    ("atomr_device_standby_switches", "counter", None, 6.0),
    ("atomr_device_standby_switch_seconds", "gauge", None, 0.25),
    ("atomr_device_standby_ready", "gauge", None, 1.0),
]
"""Each family: name, kind, then the sample of ``plain`` and of ``spare`` (None: none)."""


def test_every_family_samples_each_device_of_the_snapshot() -> None:
    collector = DeviceCollector()
    collector.update("plain", PLAIN)
    collector.update("spare", SPARE)
    families = list(collector.collect())
    assert [(f.name, f.type) for f in families] == [(n, k) for n, k, _, _ in FAMILIES]
    for family, (_, _, plain, spare) in zip(families, FAMILIES, strict=True):
        assert all(s.labels.keys() == {"device"} for s in family.samples)
        values = {s.labels["device"]: s.value for s in family.samples
                  if not s.name.endswith("_created")}
        assert values == {k: v for k, v in (("plain", plain), ("spare", spare))
                          if v is not None}, family.name


def test_an_empty_snapshot_gives_every_family_without_samples() -> None:
    families = list(DeviceCollector().collect())
    assert [f.name for f in families] == [n for n, _, _, _ in FAMILIES]
    assert all(not f.samples for f in families)
