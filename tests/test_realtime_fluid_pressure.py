"""The fluid's pressure solve on the CPU backend: multigrid-preconditioned conjugate
gradients to a stated tolerance.

After a step of a random velocity field, the divergence left, ``max|div u| / max|u|``
(grid units, ``h = 1``; computed here in float64 from the face velocities), is at most
1e-3 with the defaults, on square and non-square grids; the tolerance and the iteration
budget change it as they say, and bad settings raise ``InvalidArgument``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, FluidSimulationActor, InvalidArgument, System

Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[System, Device]]:
    with System.open("fluid-pressure") as system:
        yield system, system.spawn_device(mock=True)


def divergence_left(fluid: FluidSimulationActor) -> float:
    """``max|div u| / max|u|`` of the fluid's face velocities, in float64."""
    u, v = (a.astype(np.float64) for a in fluid.face_velocities())
    div = (u[:, 1:] - u[:, :-1]) + (v[1:, :] - v[:-1, :])
    return float(np.abs(div).max() / max(np.abs(u).max(), np.abs(v).max()))


def stir(fluid: FluidSimulationActor, seed: int, cells: int = 120) -> None:
    """Random velocities (standard deviation 5 cells a second) at random cells."""
    rng = np.random.default_rng(seed)
    for _ in range(cells):
        x, y = int(rng.integers(0, fluid.width)), int(rng.integers(0, fluid.height))
        fluid.add_velocity(x, y, float(rng.normal() * 5), float(rng.normal() * 5))


@pytest.mark.parametrize(("width", "height"), [(16, 16), (33, 20), (7, 29), (48, 48), (5, 3)])
def test_a_step_leaves_the_field_divergence_free(env: tuple[System, Device], width: int,
                                                 height: int) -> None:
    system, dev = env
    fluid = FluidSimulationActor.spawn(system, width, height, device=dev)
    stir(fluid, width * 100 + height)
    assert divergence_left(fluid) > 0.1
    for _ in range(3):
        fluid.step(0.05)
        assert divergence_left(fluid) <= 1e-3
        stir(fluid, width + height, cells=10)  # new divergence for the next step
    fluid.stop()


def test_the_original_spawn_signature_still_projects(env: tuple[System, Device]) -> None:
    system, dev = env
    fluid = FluidSimulationActor.spawn(system, 24, 24, 0.0, None, device=dev)
    stir(fluid, 1)
    fluid.step(0.05)
    assert divergence_left(fluid) <= 1e-3
    fluid.stop()


def test_the_tolerance_and_the_budget_bound_the_solve(env: tuple[System, Device]) -> None:
    system, dev = env
    left = {}
    settings: dict[str, dict[str, Any]] = {
        "loose": {"pressure_tolerance": 1e-2}, "default": {},
        "tight": {"pressure_tolerance": 1e-6, "pressure_iterations": 200},
        "one iteration": {"pressure_iterations": 1}, "none": {"pressure_iterations": 0}}
    for label, options in settings.items():
        fluid = FluidSimulationActor.spawn(system, 40, 30, device=dev, **options)
        stir(fluid, 7)
        fluid.step(0.05)
        left[label] = divergence_left(fluid)
        fluid.stop()
    assert left["loose"] <= 5e-2
    assert left["default"] <= 1e-3 and left["default"] < left["loose"]
    assert left["tight"] <= 1e-5 and left["tight"] < left["default"]
    assert left["one iteration"] > left["default"]
    assert left["none"] > 0.1  # no solve: the advected field's divergence is all there


@pytest.mark.parametrize("options", [
    {"pressure_tolerance": 0.0}, {"pressure_tolerance": -1e-4}, {"pressure_tolerance": 1.0},
    {"pressure_tolerance": float("nan")}, {"pressure_tolerance": "1e-4"},
    {"pressure_tolerance": True}, {"pressure_iterations": -1}, {"pressure_iterations": 2.5},
    {"pressure_iterations": True}])
def test_bad_solve_settings_are_refused(env: tuple[System, Device],
                                        options: dict[str, Any]) -> None:
    system, dev = env
    with pytest.raises(InvalidArgument):
        FluidSimulationActor.spawn(system, 8, 8, device=dev, **options)
