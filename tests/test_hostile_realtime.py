"""Realtime actors given sizes no machine holds, and numbers no float32 holds.

A state too large for this machine is refused by ``spawn`` with
``OutOfMemory`` (the actor never starts, so it cannot die in its start); a
number finite in float64 but not in float32 is an ``InvalidArgument`` before
it reaches the device, and the actor keeps its state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import InvalidArgument, OutOfMemory, System
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    GpuHashMapActor,
    MultiPassAnalysisActor,
    ParticleSystemActor,
)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("hostile-realtime") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(0, mock=True)


HUGE: dict[str, Callable[[System, Device], Any]] = {
    "cloth": lambda s, d: ClothSimulationActor.spawn(s, width=10**5, height=10**5, device=d),
    "fluid": lambda s, d: FluidSimulationActor.spawn(s, width=10**6, height=10**6, device=d),
    "analysis": lambda s, d: MultiPassAnalysisActor.spawn(s, 4, 4, 1, bins=2**40, device=d),
    "hash map": lambda s, d: GpuHashMapActor.spawn(s, 2**40, 64, 64, device=d),
    "placed cloth": lambda s, d: ClothSimulationActor.spawn(s, width=10**5, height=10**5),
}


@pytest.mark.parametrize("case", HUGE)
def test_a_state_larger_than_the_machine_is_refused_at_spawn(
        system: System, dev: Device, case: str) -> None:
    with pytest.raises(OutOfMemory, match="needs") as caught:
        HUGE[case](system, dev)
    assert caught.value.requested is not None and caught.value.available is not None
    assert caught.value.requested > caught.value.available
    cloth = ClothSimulationActor.spawn(system, width=4, height=3, device=dev)
    assert cloth.positions().shape == (12, 3)


def test_numbers_beyond_float32_are_refused_and_the_particles_stay(
        system: System, dev: Device) -> None:
    p = ParticleSystemActor.spawn(system, device=dev)
    p.emit([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]])
    calls: dict[str, Callable[[], object]] = {
        "position": lambda: p.emit([[1e39, 0.0, 0.0]], [[0.0, 0.0, 0.0]]),
        "velocity": lambda: p.emit([[0.0, 0.0, 0.0]], [[0.0, -1e39, 0.0]]),
        "dt": lambda: p.step(1e300),
        "gravity": lambda: ParticleSystemActor.spawn(system, gravity_y=-1e39, device=dev),
        "wind": lambda: ClothSimulationActor.spawn(system, 2, 2, wind=(1e39, 0, 0),
                                                    device=dev),
        "amount": lambda: FluidSimulationActor.spawn(system, 4, 4, device=dev).add_density(
            1, 1, 3.5e38),
    }
    for name, call in calls.items():
        with pytest.raises(InvalidArgument, match="float32"):
            call()
        assert p.live_count() == 1, name
    p.step(0.0)
    np.testing.assert_array_equal(p.positions(), [[1.0, 2.0, 3.0]])
    largest = float(np.finfo(np.float32).max)
    p.emit([[largest, 0.0, 0.0]], [[0.0, 0.0, 0.0]])
    assert p.live_count() == 2
