"""Chaos: 4,000 concurrent asks while workers are SIGKILLed and contexts poisoned or OOM.

The engine is ``benchmarks/chaos_soak.py`` (its longer variant); this runs it
small (4,000 asks: CI time), with a fixed seed (printed; ``ATOMR_CHAOS_SEED`` picks another).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SEED = int(os.environ.get("ATOMR_CHAOS_SEED", "20240611"))


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """asyncio without debug mode: its per-callback bookkeeping makes the asks 4x slower."""
    return ("asyncio", {"debug": False})


def load_soak() -> ModuleType:
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    return importlib.import_module("chaos_soak")


@pytest.mark.serial  # a soak: what its faults catch in flight depends on the load around it
async def test_4000_asks_under_chaos_all_answered_right_and_nothing_leaks() -> None:
    chaos = load_soak()
    print(f"chaos seed: {SEED}")
    config = chaos.SoakConfig(asks=4_000, seed=SEED, clients=24)
    async with asyncio.timeout(100):  # a hang fails here, not at pytest's limit
        report = await chaos.soak(config)
    print(report.summary())

    assert report.asks == report.answered == 4_000  # every ask answered
    assert report.timeouts == 0  # none waited out its timeout: no hangs
    assert report.unexpected == []  # only typed errors from the taxonomy, as expected
    assert report.wrong == []  # every result matched NumPy; durable buffers came back whole
    assert report.ok > report.asks // 2 and report.errors["ContextPoisoned"] > 0
    assert report.faults["kill"] > 0 and report.faults["poison"] > 0
    assert report.faults["oom"] > 0
    for device in ("process", "thread"):
        assert report.devices[device]["restarts"] > 0  # ... and it served at the end
        assert report.devices[device]["increments"] > 0
    assert report.worker_pids  # the workers seen, all gone now
    assert [pid for pid in chaos.children() if pid in report.worker_pids] == []
    assert chaos.children() == []
    assert chaos.segments() == []
