"""The realtime physics actors on CUDA against the CPU backend on the same inputs and steps.

Each actor runs twice, on a CUDA device and on a CPU device, and the results
agree to float32 tolerance after several steps; the physics checks of
``test_realtime_physics.py`` run again on CUDA (ballistic path, projection,
density, pinned row, brute-force radius search).
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    ParticleSystemActor,
    SpatialIndexActor,
)

pytestmark = pytest.mark.gpu

G = -9.8
Devices = tuple[System, Device, Device]


@pytest.fixture(scope="module")
def devices() -> Iterator[Devices]:
    with System.open("realtime-physics-gpu") as system:
        yield system, system.spawn_device(mock=False), system.spawn_device(mock=True)


@pytest.mark.parametrize("drag", [0.0, 0.4])
def test_particles_equal_the_cpu_backend(devices: Devices, drag: float) -> None:
    system, cuda, cpu = devices
    rng = np.random.default_rng(11)
    n = 50_000
    pos = rng.uniform(0, 3, (n, 3))
    vel = rng.normal(0, 3, (n, 3))
    life = rng.uniform(0.05, 0.6, n)
    actors = [ParticleSystemActor.spawn(system, G, drag, 0.7, device=d) for d in (cuda, cpu)]
    for actor in actors:
        actor.emit(pos, vel, life, timeout_secs=30)
    for _ in range(25):
        counts = [actor.step(0.02, timeout_secs=30) for actor in actors]
        assert counts[0] == counts[1]
    got, want = (a.positions(timeout_secs=30) for a in actors)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got, want = (a.velocities(timeout_secs=30) for a in actors)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(actors[0].lifetimes(), actors[1].lifetimes(), rtol=1e-6)


def test_a_particle_on_cuda_follows_the_ballistic_path(devices: Devices) -> None:
    system, cuda, _ = devices
    ps = ParticleSystemActor.spawn(system, device=cuda)
    p0, v0 = np.array([1.5, 20.0, -2.0]), np.array([3.0, 4.0, 0.5])
    ps.emit([p0], [v0])
    for _ in range(60):
        ps.step(1 / 60)
    want = p0 + v0 + 0.5 * np.array([0.0, G, 0.0])
    np.testing.assert_allclose(ps.positions()[0], want, rtol=1e-5, atol=1e-4)


def test_cloth_equals_the_cpu_backend(devices: Devices) -> None:
    system, cuda, cpu = devices
    actors = [ClothSimulationActor.spawn(system, 40, 30, 0.05, 0.6, 6, device=d,
                                         wind=(0.5, 0.0, 2.0)) for d in (cuda, cpu)]
    for actor in actors:
        actor.pin(range(40))
    for _ in range(60):
        for actor in actors:
            actor.step(1 / 60)
    got, want = (a.positions() for a in actors)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    top_row = np.stack([np.arange(40) * 0.05, np.zeros(40), np.zeros(40)], axis=-1)
    np.testing.assert_allclose(got[:40], top_row, atol=1e-6)


def test_the_cuda_cloth_settles_near_rest(devices: Devices) -> None:
    system, cuda, _ = devices
    cloth = ClothSimulationActor.spawn(system, device=cuda)
    cloth.pin(range(16))
    for _ in range(300):
        cloth.step(1 / 60)
    grid = cloth.positions().reshape(16, 16, 3)
    for a, b in ((grid[:, 1:], grid[:, :-1]), (grid[1:], grid[:-1])):
        assert np.all(np.abs(np.linalg.norm(a - b, axis=-1) / 0.1 - 1) < 0.10)


def _stir(fluids: list[FluidSimulationActor], seed: int, w: int, h: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        x, y = int(rng.integers(1, w - 1)), int(rng.integers(1, h - 1))
        vx, vy, amount = (float(c) for c in rng.normal(0, 4, 3))
        for fluid in fluids:
            fluid.add_velocity(x, y, vx, vy)
            fluid.add_density(x, y, abs(amount))


@pytest.mark.parametrize("viscosity", [0.0, 0.5])
def test_fluid_equals_the_cpu_backend(devices: Devices, viscosity: float) -> None:
    system, cuda, cpu = devices
    w, h = 48, 40
    solve = {"pressure_tolerance": 1e-6, "pressure_iterations": 100}  # to float32 rounding
    fluids = [FluidSimulationActor.spawn(system, w, h, viscosity, device=cuda, **solve),
              FluidSimulationActor.spawn(system, w, h, viscosity, device=cuda, use_graph=False,
                                         **solve),
              FluidSimulationActor.spawn(system, w, h, viscosity, device=cpu, **solve)]
    _stir(fluids, 3, w, h)
    for dt in (0.05, 0.05, 0.03, 0.05, 0.02):  # dt changes between replays of one graph
        for fluid in fluids:
            fluid.step(dt)
    want_d = fluids[2].density()
    want_u, want_v = fluids[2].face_velocities()
    for fluid in fluids[:2]:
        np.testing.assert_allclose(fluid.density(), want_d, rtol=1e-3, atol=1e-4)
        u, v = fluid.face_velocities()
        np.testing.assert_allclose(u, want_u, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(v, want_v, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(fluid.divergence(), fluids[2].divergence(), atol=1e-4)


def _divergence_left(fluid: FluidSimulationActor) -> float:
    u, v = (a.astype(np.float64) for a in fluid.face_velocities())
    div = (u[:, 1:] - u[:, :-1]) + (v[1:, :] - v[:-1, :])
    return float(np.abs(div).max() / max(np.abs(u).max(), np.abs(v).max()))


@pytest.mark.parametrize(("w", "h"), [(256, 192), (97, 61)])
def test_the_cuda_solve_meets_the_default_tolerance_as_the_cpu_does(devices: Devices, w: int,
                                                                   h: int) -> None:
    system, cuda, cpu = devices
    fluids = [FluidSimulationActor.spawn(system, w, h, device=d) for d in (cuda, cpu)]
    rng = np.random.default_rng(w)
    for _ in range(200):
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
        vx, vy = (float(c) for c in rng.normal(0, 5, 2))
        for fluid in fluids:
            fluid.add_velocity(x, y, vx, vy)
    for _ in range(3):
        left = []
        for fluid in fluids:
            fluid.step(0.05)
            left.append(_divergence_left(fluid))
        assert max(left) <= 1e-3, left
    (gu, gv), (cu, cv) = (f.face_velocities() for f in fluids)
    scale = float(max(np.abs(cu).max(), np.abs(cv).max()))
    np.testing.assert_allclose(gu, cu, rtol=0, atol=1e-3 * scale)
    np.testing.assert_allclose(gv, cv, rtol=0, atol=1e-3 * scale)


def test_the_cuda_projection_and_density(devices: Devices) -> None:
    system, cuda, _ = devices
    w = h = 32
    fluid = FluidSimulationActor.spawn(system, w, h, device=cuda, pressure_iterations=300,
                                       pressure_tolerance=1e-6)
    rng = np.random.default_rng(4)
    for _ in range(40):  # as in test_realtime_physics: deposits away from the walls
        x, y = (int(c) for c in rng.integers(10, 22, 2))
        fluid.add_density(x, y, float(rng.uniform(0.5, 2)))
    total = float(fluid.density().astype(np.float64).sum())
    rng = np.random.default_rng(5)
    for _ in range(12):
        fluid.add_velocity(int(rng.integers(1, w - 1)), int(rng.integers(1, h - 1)),
                           float(rng.normal() * 4), float(rng.normal() * 4))
    u, v = fluid.face_velocities()
    before = np.abs((u[:, 1:] - u[:, :-1]) + (v[1:] - v[:-1])).max()
    fluid.step(0.05)
    assert np.abs(fluid.divergence()).max() < 1e-4 * before
    for _ in range(9):
        fluid.step(0.05)
    assert abs(float(fluid.density().astype(np.float64).sum()) - total) < 0.02 * total


def test_the_spatial_index_equals_the_cpu_backend_and_brute_force(devices: Devices) -> None:
    system, cuda, cpu = devices
    rng = np.random.default_rng(21)
    points = rng.uniform(-10, 10, (100_000, 3))
    queries = rng.uniform(-11, 11, (300, 3))
    indexes = [SpatialIndexActor.spawn(system, 0.8, device=d) for d in (cuda, cpu)]
    for index in indexes:
        index.insert(points[:60_000], timeout_secs=30)
        index.insert(points[60_000:], timeout_secs=30)
    p32 = points.astype(np.float32)
    for radius in (0.5, 0.8, 2.1):
        got, want = (index.query_many(queries, radius, timeout_secs=30) for index in indexes)
        assert got == want
        for query, hits in zip(queries[:50], got[:50], strict=True):
            d = p32 - query.astype(np.float32)
            d2 = d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2]
            assert hits == np.flatnonzero(d2 <= np.float32(radius) ** 2).tolist()
    x, y, z = points[5]
    assert 5 in indexes[0].query_neighbors(x, y, z)
