"""The realtime physics actors on the CPU backend against physics and independent references.

Particles follow the analytic ballistic path and the exact linear-drag
solution, bounce with their speed scaled by ``bounce`` and die with their
lifetimes. The fluid's projection leaves a divergence below 1e-4 of what it
started with, conserves density without sources or viscosity within the
advection's tolerance, and its ``divergence`` equals one computed here. The
cloth's pinned row stays put, its springs stay within 10% of rest after
settling, and a step equals a plain loop over the springs. The spatial index
equals brute-force radius search.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, GpuRefStale, InvalidArgument, System
from atomr_accel.core.ops._faults import FaultKind
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    ParticleSystemActor,
    SpatialIndexActor,
)

G = -9.8


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[System, Device]]:
    with System.open("realtime-physics") as system:
        yield system, system.spawn_device(mock=True)


# --------------------------------------------------------------------- particles


def test_a_particle_without_drag_follows_the_ballistic_path(env: tuple[System, Device]) -> None:
    system, _ = env
    ps = ParticleSystemActor.spawn(system, gravity_y=G, drag=0.0, bounce=0.5)
    p0, v0 = np.array([1.5, 20.0, -2.0]), np.array([3.0, 4.0, 0.5])
    ps.emit([p0], [v0])
    dt = 1 / 60
    for n in range(1, 61):
        assert ps.step(dt) == 1
        t = n * dt
        want = p0 + v0 * t + 0.5 * np.array([0.0, G, 0.0]) * t * t
        np.testing.assert_allclose(ps.positions()[0], want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(ps.velocities()[0], v0 + np.array([0.0, G, 0.0]) * 1.0,
                               rtol=1e-5, atol=1e-4)


def test_linear_drag_follows_the_exact_solution(env: tuple[System, Device]) -> None:
    system, _ = env
    k = 0.7
    ps = ParticleSystemActor.spawn(system, gravity_y=G, drag=k)
    v0 = np.array([2.0, 5.0, -1.0])
    ps.emit([[0.0, 100.0, 0.0]], [v0])
    for _ in range(50):
        ps.step(0.02)
    t = 1.0
    terminal = np.array([0.0, G / k, 0.0])
    v = terminal + (v0 - terminal) * np.exp(-k * t)
    x = terminal * t + (v0 - terminal) * (1 - np.exp(-k * t)) / k + np.array([0, 100.0, 0])
    np.testing.assert_allclose(ps.velocities()[0], v, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ps.positions()[0], x, rtol=1e-4, atol=1e-4)


def test_a_bounce_scales_the_speed_by_bounce(env: tuple[System, Device]) -> None:
    system, _ = env
    bounce, h, dt = 0.6, 2.0, 1e-3
    ps = ParticleSystemActor.spawn(system, gravity_y=G, bounce=bounce)
    ps.emit([[0.0, h, 0.0]], [[0.0, 0.0, 0.0]])
    steps = 0
    while ps.velocities()[0, 1] <= 0:
        ps.step(dt)
        steps += 1
        assert steps < 2000
    impact = np.sqrt(2 * -G * h)  # the speed on reaching the ground
    up = ps.velocities()[0, 1]
    assert abs(up - bounce * impact) <= bounce * -G * dt * 1.01
    assert ps.positions()[0, 1] >= 0
    peak = 0.0
    for _ in range(2000):  # climb to the top of the next arc: about bounce^2 * h
        ps.step(dt)
        peak = max(peak, float(ps.positions()[0, 1]))
        if ps.velocities()[0, 1] < 0:
            break
    assert abs(peak - bounce**2 * h) < 0.02


def test_lifetimes_kill_and_survivors_keep_their_order(env: tuple[System, Device]) -> None:
    system, _ = env
    rng = np.random.default_rng(1)
    ps = ParticleSystemActor.spawn(system, gravity_y=0.0)
    n = 3000  # past the first capacity: the buffers grow
    pos = rng.uniform(1, 5, (n, 3))
    vel = rng.normal(0, 1, (n, 3))
    life = rng.uniform(0.01, 0.2, n)
    assert ps.emit(pos[:1000], vel[:1000], life[:1000]) == 1000
    assert ps.emit(pos[1000:], vel[1000:], life[1000:]) == n
    remaining = life.astype(np.float32)
    dt = np.float32(0.03)
    for step in range(1, 6):
        alive = ps.step(float(dt))
        remaining = remaining - dt
        keep = remaining > 0
        assert alive == int(keep.sum()) == ps.live_count()
        pos, vel, remaining = pos[keep], vel[keep], remaining[keep]
        np.testing.assert_allclose(ps.positions(), pos + vel * (step * float(dt)), atol=1e-4)
        np.testing.assert_allclose(ps.lifetimes(), remaining, rtol=1e-5, atol=1e-6)
    assert ps.step(0.5) == 0 and ps.step(0.5) == 0
    assert ps.positions().shape == (0, 3)


def test_particles_refuse_bad_input(env: tuple[System, Device]) -> None:
    system, _ = env
    ps = ParticleSystemActor.spawn(system)
    for call in (lambda: ps.emit([[0, 0]], [[0, 0]]),
                 lambda: ps.emit([[0, 0, 0]], [[0, 0, 0], [1, 1, 1]]),
                 lambda: ps.emit([[0, np.nan, 0]], [[0, 0, 0]]),
                 lambda: ps.emit([[0, 0, 0]], [[0, 0, 0]], [0.0]),
                 lambda: ps.step(-1.0), lambda: ps.step(float("inf")),
                 lambda: ps.step(0.1, timeout_secs=0),
                 lambda: ParticleSystemActor.spawn(system, drag=-1.0),
                 lambda: ParticleSystemActor.spawn(system, device="gpu0")):
        with pytest.raises(InvalidArgument):
            call()
    assert ps.step(0.1) == 0  # still serving


# ------------------------------------------------------------------------ cloth


def test_the_pinned_row_stays_and_springs_stay_near_rest(env: tuple[System, Device]) -> None:
    system, device = env
    cloth = ClothSimulationActor.spawn(system, device=device)
    start = cloth.positions()
    cloth.pin(range(16))
    for _ in range(300):
        cloth.step(1 / 60)
    x = cloth.positions()
    np.testing.assert_array_equal(x[:16], start[:16])
    grid = x.reshape(16, 16, 3)
    for a, b in ((grid[:, 1:], grid[:, :-1]), (grid[1:], grid[:-1])):
        lengths = np.linalg.norm(a - b, axis=-1) / 0.1
        assert np.all(np.abs(lengths - 1) < 0.10), (lengths.min(), lengths.max())
    assert grid[15, :, 1].mean() < start.reshape(16, 16, 3)[15, :, 1].mean() - 1e-3  # it sagged


def _plain_cloth_step(pos: np.ndarray[Any, Any], prev: np.ndarray[Any, Any],
                      inv: np.ndarray[Any, Any], w: int, h: int, spacing: float,
                      stiffness: float, iterations: int, dt: float, damping: float,
                      accel: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """Verlet and Gauss-Seidel relaxation written as plain loops over the springs."""
    new = pos.copy()
    for i in range(w * h):
        if inv[i] > 0:
            new[i] = pos[i] + (pos[i] - prev[i]) * damping + accel * dt * dt
    kinds = [((0, 1), spacing, lambda r, c: c % 2), ((1, 0), spacing, lambda r, c: r % 2),
             ((1, 1), spacing * 2**0.5, lambda r, c: r % 2),
             ((1, -1), spacing * 2**0.5, lambda r, c: r % 2),
             ((0, 2), 2 * spacing, lambda r, c: (c // 2) % 2),
             ((2, 0), 2 * spacing, lambda r, c: (r // 2) % 2)]
    for _ in range(iterations):
        for (dr, dc), rest, colour in kinds:
            for k in (0, 1):
                for r in range(h):
                    for c in range(w):
                        r2, c2 = r + dr, c + dc
                        if colour(r, c) != k or r2 >= h or not 0 <= c2 < w:
                            continue
                        i, j = r * w + c, r2 * w + c2
                        d = new[j] - new[i]
                        length = np.linalg.norm(d)
                        wsum = inv[i] + inv[j]
                        if length > 1e-12 and wsum > 0:
                            s = stiffness * (length - rest) / (length * wsum)
                            new[i] = new[i] + d * s * inv[i]
                            new[j] = new[j] - d * s * inv[j]
    return new, pos.copy()


def test_a_cloth_step_equals_plain_loops(env: tuple[System, Device]) -> None:
    system, _ = env
    w, h, spacing = 6, 5, 0.2
    wind = np.array([0.5, 0.0, 1.5])
    cloth = ClothSimulationActor.spawn(system, w, h, spacing, 0.8, 3, wind=tuple(wind))
    cloth.pin([0, 5])
    pos = cloth.positions().astype(np.float64)
    prev = pos.copy()
    inv = np.ones(w * h)
    inv[[0, 5]] = 0
    accel = np.array([0.0, G, 0.0]) + wind
    for _ in range(4):
        cloth.step(0.02)
        pos, prev = _plain_cloth_step(pos, prev, inv, w, h, spacing, 0.8, 3, 0.02, 0.99, accel)
    np.testing.assert_allclose(cloth.positions(), pos, rtol=1e-4, atol=1e-5)


def test_cloth_refuses_bad_input(env: tuple[System, Device]) -> None:
    system, _ = env
    cloth = ClothSimulationActor.spawn(system, 4, 4)
    for call in (lambda: cloth.pin([16]), lambda: cloth.pin([-1]), lambda: cloth.pin([0.5]),
                 lambda: cloth.step(float("nan")), lambda: cloth.set_wind([1, 2]),
                 lambda: ClothSimulationActor.spawn(system, 0, 4),
                 lambda: ClothSimulationActor.spawn(system, 4, 4, stiffness=2.0),
                 lambda: ClothSimulationActor.spawn(system, 4, 4, spacing=0.0)):
        with pytest.raises(InvalidArgument):
            call()
    cloth.step(0.01)


# ------------------------------------------------------------------------ fluid


def mac_divergence(u: np.ndarray[Any, Any], v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Net outflow of each cell, in float64."""
    u, v = u.astype(np.float64), v.astype(np.float64)
    out: np.ndarray[Any, Any] = (u[:, 1:] - u[:, :-1]) + (v[1:, :] - v[:-1, :])
    return out


def _stir(fluid: FluidSimulationActor, seed: int, w: int, h: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(12):
        fluid.add_velocity(int(rng.integers(1, w - 1)), int(rng.integers(1, h - 1)),
                           float(rng.normal() * 4), float(rng.normal() * 4))


def test_projection_leaves_almost_no_divergence(env: tuple[System, Device]) -> None:
    system, _ = env
    w, h = 16, 12
    fluid = FluidSimulationActor.spawn(system, w, h, pressure_iterations=1500)
    _stir(fluid, 2, w, h)
    u, v = fluid.face_velocities()
    assert u.shape == (h, w + 1) and v.shape == (h + 1, w)
    before = np.abs(mac_divergence(u, v)).max()
    assert before > 1
    fluid.step(0.05)
    u, v = fluid.face_velocities()
    after = mac_divergence(u, v)
    assert np.abs(after).max() < 1e-4 * before
    np.testing.assert_allclose(fluid.divergence(), after, atol=1e-6)
    assert np.abs(u[:, [0, w]]).max() == 0 and np.abs(v[[0, h], :]).max() == 0  # walls
    centred = fluid.velocity()
    np.testing.assert_allclose(centred[..., 0], (u[:, :-1] + u[:, 1:]) / 2, rtol=1e-6)
    np.testing.assert_allclose(centred[..., 1], (v[:-1] + v[1:]) / 2, rtol=1e-6)


def test_density_is_conserved_without_sources_or_viscosity(env: tuple[System, Device]) -> None:
    system, _ = env
    w = h = 32
    fluid = FluidSimulationActor.spawn(system, w, h, viscosity=0.0, pressure_iterations=200)
    rng = np.random.default_rng(4)
    total = 0.0
    for _ in range(40):
        x, y = (int(c) for c in rng.integers(10, 22, 2))
        amount = float(rng.uniform(0.5, 2))
        fluid.add_density(x, y, amount)
        total += amount
    _stir(fluid, 5, w, h)
    np.testing.assert_allclose(fluid.density().sum(), total, rtol=1e-5)
    for _ in range(10):
        fluid.step(0.05)
    density = fluid.density()
    assert abs(density.sum() - total) < 0.02 * total
    assert density.min() >= -1e-6  # bilinear advection makes no negative density


def test_viscosity_slows_the_flow(env: tuple[System, Device]) -> None:
    system, _ = env
    speeds = []
    for viscosity in (0.0, 2.0):
        fluid = FluidSimulationActor.spawn(system, 16, 16, viscosity)
        _stir(fluid, 6, 16, 16)
        for _ in range(5):
            fluid.step(0.05)
        speeds.append(float(np.abs(fluid.velocity()).sum()))
    assert speeds[1] < 0.9 * speeds[0]


def test_fluid_refuses_bad_input(env: tuple[System, Device]) -> None:
    system, _ = env
    fluid = FluidSimulationActor.spawn(system, 8, 8)
    for call in (lambda: fluid.add_density(8, 0, 1.0), lambda: fluid.add_density(0, -1, 1.0),
                 lambda: fluid.add_density(0.5, 1, 1.0),
                 lambda: fluid.add_velocity(1, 1, float("nan"), 0.0),
                 lambda: fluid.step(-0.1),
                 lambda: FluidSimulationActor.spawn(system, 8, 8, viscosity=-1.0),
                 lambda: FluidSimulationActor.spawn(system, 8, 8, pressure_iterations=-2)):
        with pytest.raises(InvalidArgument):
            call()
    fluid.step(0.1)
    assert np.all(fluid.density() == 0)


# ------------------------------------------------------------------ spatial index


def brute_force(points: np.ndarray[Any, Any], query: np.ndarray[Any, Any],
                radius: float) -> list[int]:
    p = points.astype(np.float32)
    d = p - query.astype(np.float32)
    d2 = d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2]
    return np.flatnonzero(d2 <= np.float32(radius) * np.float32(radius)).tolist()


@pytest.mark.parametrize("table_size", [None, 7])
def test_the_spatial_index_equals_brute_force(env: tuple[System, Device],
                                              table_size: int | None) -> None:
    system, _ = env
    rng = np.random.default_rng(8)
    index = SpatialIndexActor.spawn(system, 0.5, table_size=table_size)
    points = rng.uniform(-3, 3, (2500, 3))
    assert index.insert(points[:1200]) == range(0, 1200)
    assert index.insert(points[1200:]) == range(1200, 2500)
    assert index.count() == 2500
    queries = rng.uniform(-3.5, 3.5, (40, 3))
    for radius in (None, 0.2, 0.5, 1.3):
        got = index.query_many(queries, radius)
        for query, hits in zip(queries, got, strict=True):
            assert hits == brute_force(points, query, 0.5 if radius is None else radius)
    x, y, z = points[17]
    assert 17 in index.query_neighbors(x, y, z)
    assert index.query_neighbors(*queries[3], radius=0.7) == brute_force(points, queries[3], 0.7)


def test_the_spatial_index_rebuilds_after_inserts(env: tuple[System, Device]) -> None:
    system, _ = env
    index = SpatialIndexActor.spawn(system, 1.0)
    assert index.query_neighbors(0, 0, 0) == []
    index.insert([0.1, 0.2, 0.3])
    assert index.rebuild() == 1
    assert index.query_neighbors(0, 0, 0) == [0]
    index.insert([[0.0, 0.0, 0.5], [5.0, 5.0, 5.0]])
    assert index.query_neighbors(0, 0, 0) == [0, 1]
    for call in (lambda: index.insert([[1, 2]]), lambda: index.query_neighbors(0, 0, "a"),
                 lambda: index.query_many([[0, 0, 0]], -1.0),
                 lambda: index.query_many([[0, 0, 0]], 100.0),
                 lambda: SpatialIndexActor.spawn(system, 0.0)):
        with pytest.raises(InvalidArgument):
            call()


def test_a_system_places_the_actors_on_its_device(env: tuple[System, Device]) -> None:
    system, _ = env
    index = SpatialIndexActor.spawn(system, 1.0)  # device=None: the system's placement
    index.insert([0.0, 0.0, 0.0])
    assert index.query_neighbors(0, 0, 0) == [0]
    with pytest.raises(InvalidArgument):
        SpatialIndexActor.spawn(object(), 1.0)


def test_stopped_actors_free_their_buffers(env: tuple[System, Device]) -> None:
    system, _ = env
    device = system.spawn_device(mock=True)
    baseline = device.stats().bytes_allocated
    actors: list[Any] = [
        ParticleSystemActor.spawn(system, device=device),
        ClothSimulationActor.spawn(system, 8, 8, device=device),
        FluidSimulationActor.spawn(system, 8, 8, device=device),
        SpatialIndexActor.spawn(system, 1.0, device=device),
    ]
    actors[0].emit(np.ones((5, 3)), np.ones((5, 3)))
    actors[0].step(0.1)
    actors[1].step(0.1)
    actors[2].step(0.1)
    actors[3].insert(np.ones((5, 3)))
    assert actors[3].query_neighbors(1, 1, 1) == [0, 1, 2, 3, 4]
    assert device.stats().bytes_allocated > baseline
    for actor in actors:
        actor.stop()
    deadline = time.monotonic() + 10
    while device.stats().bytes_allocated != baseline:
        assert time.monotonic() < deadline, "the buffers were not freed"
        time.sleep(0.01)


def test_the_steps_run_the_same_on_a_process_host(env: tuple[System, Device]) -> None:
    system, thread_device = env
    process_device = system.spawn_device(mock=True, isolation="process")
    rng = np.random.default_rng(12)
    pos, vel, life = rng.uniform(0, 2, (200, 3)), rng.normal(0, 2, (200, 3)), rng.uniform(
        0.05, 0.5, 200)
    results = []
    for device in (thread_device, process_device):
        ps = ParticleSystemActor.spawn(system, drag=0.2, device=device)
        ps.emit(pos, vel, life)
        counts = [ps.step(0.03) for _ in range(10)]
        fluid = FluidSimulationActor.spawn(system, 12, 10, 0.3, device=device)
        fluid.add_velocity(5, 5, 3.0, -2.0)
        fluid.add_density(5, 5, 1.0)
        for _ in range(3):
            fluid.step(0.05)
        results.append((counts, ps.positions(), fluid.density()))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])
    np.testing.assert_array_equal(results[0][2], results[1][2])


def test_a_rebuilt_context_restarts_the_simulation(env: tuple[System, Device]) -> None:
    system, _ = env
    device = system.spawn_device(mock=True)
    ps = ParticleSystemActor.spawn(system, device=device)
    cloth = ClothSimulationActor.spawn(system, 4, 4, device=device)
    ps.emit(np.ones((3, 3)), np.zeros((3, 3)))
    assert ps.step(0.01) == 3
    assert cloth.positions().shape == (16, 3)  # the cloth has started on this context
    with pytest.raises(ContextPoisoned):
        device.inject_fault(FaultKind.POISON)
    for call in (lambda: ps.step(0.01), cloth.positions):
        with pytest.raises(GpuRefStale):
            call()
    assert ps.step(0.01) == 0  # empty again, on the new context
    assert ps.emit(np.ones((2, 3)), np.zeros((2, 3))) == 2
    assert cloth.positions().shape == (16, 3)
