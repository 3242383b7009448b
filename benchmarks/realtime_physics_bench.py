"""Realtime physics: the actors' steps beside the same steps written directly in CuPy.

Particles (``--particles``, 16M by default): ``ParticleSystemActor.step``
(one ``ParticleStep`` op answering the live count, host to host), the same op
run with ``Device.run`` without the actor, beside the same step written
directly as CuPy array expressions (ending in ``count_nonzero`` of the live
lifetimes) and beside our NVRTC kernel launched directly from CuPy. Bytes
touched: positions, velocities and lifetimes read and written, 56 bytes a
particle; GB/s is that over the step's wall time, and the share of the
H100's 3350 GB/s.

Fluid (``--fluid`` cells a side, 1024 by default, no viscosity, the pressure
solved to ``--tolerance``, 1e-4 by default, within 40 iterations):
``FluidSimulationActor.step`` with its stages replayed as captured CUDA
graphs, and with its kernels launched one by one (``use_graph=False``), ms a
step, and the divergence the last step left, ``max|div u| / max|u|`` (grid
units, so ``h = 1``), computed here in float64 from the face velocities; and
one step of a fresh random field (every face a standard normal, the solve
started from zero), the ``FluidStep`` op run with ``Device.run``.
Cloth (64 x 64, 8 iterations) and the spatial index (1M points: build, then
10k radius queries) for reference.

Goals: particles >= 90% of the direct CuPy step and >= 50% of the
memory bandwidth; fluid 1024^2 <= 2 ms a step with max|div u| / max|u| <= 1e-3.

    python benchmarks/realtime_physics_bench.py [--json PATH] [--quick]
        [--only particles,fluid,random,other] [--tolerance 1e-4]

``--quick`` is a small smoke run on the CPU backend (no GPU needed).
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import percentile, print_table, write_json

from atomr_accel import System
from atomr_accel.core.ops._realtime_physics import FluidStep, ParticleStep, fluid_scratch
from atomr_accel.facade import Device
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    ParticleSystemActor,
    SpatialIndexActor,
)

H100_GBS = 3350.0
"""The H100 SXM's HBM3 bandwidth, GB/s."""
BYTES_PER_PARTICLE = 56
"""Position, velocity (12 bytes each) and lifetime (4) read and written."""
G, DT = -9.8, 1 / 240


def step_ms(call: Callable[[], Any], steps: int, warmup: int = 3) -> list[float]:
    """Wall time of each of ``steps`` calls after ``warmup`` untimed ones, in ms."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1e3)
    return samples


def particle_data(n: int) -> tuple[Any, Any, Any]:
    """Positions high above the ground, random velocities, every lifetime forever."""
    rng = np.random.default_rng(0)
    pos = rng.random((n, 3), dtype=np.float32) * 100
    pos[:, 1] += 1000
    vel = rng.standard_normal((n, 3), dtype=np.float32)
    return pos, vel, np.full(n, np.inf, dtype=np.float32)


def particle_rows(args: argparse.Namespace, system: System, device: Device, gpu: bool,
                  ) -> tuple[list[list[Any]], dict[str, Any]]:
    """The actor's particle step, and on a GPU the direct CuPy step and kernel beside it."""
    n = args.particles
    pos, vel, life = particle_data(n)
    actor = ParticleSystemActor.spawn(system, G, 0.0, 0.5, device=device)
    chunk = 1 << 22
    for first in range(0, n, chunk):
        part = slice(first, first + chunk)
        actor.emit(pos[part], vel[part], life[part], timeout_secs=120)
    ours = step_ms(lambda: actor.step(DT, timeout_secs=60), args.steps)
    actor.stop()
    results = {"actor": ours, "device op, no actor": device_op_steps(device, pos, vel, life,
                                                                     args.steps)}
    if gpu:
        results.update(direct_particle_steps(pos, vel, life, args.steps))
    rows, facts = [], {"n": n, "bytes_per_step": BYTES_PER_PARTICLE * n}
    for label, samples in results.items():
        p50 = percentile(samples, 50)
        gbs = BYTES_PER_PARTICLE * n / (p50 / 1e3) / 1e9
        rows.append([label, n, p50, percentile(samples, 99), gbs, 100 * gbs / H100_GBS])
        facts[label] = {"p50_ms": p50, "p99_ms": percentile(samples, 99), "gb_s": gbs}
    if gpu:
        for other in ("direct cupy", "direct kernel"):
            ratio = percentile(results[other], 50) / percentile(ours, 50)
            rows.append([f"actor speed / {other}", "", ratio, "", "", ""])
            facts[f"actor_over_{other.replace(' ', '_')}"] = ratio
    return rows, facts


def device_op_steps(device: Device, pos: Any, vel: Any, life: Any, steps: int) -> list[float]:
    """``Device.run(ParticleStep)`` from this thread on buffers of its own: the step without
    the actor, ms a step."""
    n = len(pos)
    buffers = [device.allocate(data.size) for data in (pos, vel, life)]
    for buffer, data in zip(buffers, (pos, vel, life), strict=True):
        device.copy_from_numpy(buffer, data.ravel(), timeout_secs=120)
    live = device.allocate(1, "i32")
    refs = [device.ref_of(b) for b in (*buffers, live)]
    op = ParticleStep(*refs, n, DT, G, 0.0, 0.5)
    samples = step_ms(lambda: device.run(op, timeout_secs=60), steps)
    for buffer in (*buffers, live):
        device.free(buffer)
    return samples


def direct_particle_steps(pos: Any, vel: Any, life: Any, steps: int) -> dict[str, list[float]]:
    """The same step in CuPy expressions, and our kernel launched from CuPy, ms a step."""
    cp = importlib.import_module("cupy")
    from atomr_accel.backends.cuda._realtime_physics import kernels

    p, v, lt = cp.asarray(pos), cp.asarray(vel), cp.asarray(life)
    dt, bounce = np.float32(DT), np.float32(0.5)

    def cupy_step() -> int:
        alive = lt > 0
        moved = p + v * dt
        moved[:, 1] += np.float32(0.5 * G) * dt * dt
        p[...] = cp.where(alive[:, None], moved, p)
        v[:, 1] = cp.where(alive, v[:, 1] + np.float32(G) * dt, v[:, 1])
        below = alive & (p[:, 1] < 0)
        p[:, 1] = cp.where(below, -p[:, 1] * bounce, p[:, 1])
        v[:, 1] = cp.where(below & (v[:, 1] < 0), -v[:, 1] * bounce, v[:, 1])
        lt[...] = cp.where(alive, lt - dt, lt)
        return int(cp.count_nonzero(lt > 0))

    live = cp.zeros(1, dtype=cp.int32)
    n = len(pos)
    step = kernels("particle_step")
    args = (p, v, lt, live, np.int64(n), dt, np.int32(0), np.float32(0), np.float32(0),
            np.float32(0), (np.float32(0.5) * np.float32(G)) * (dt * dt),
            np.float32(G) * dt, bounce, np.float32(0))

    def kernel_step() -> int:
        live.fill(0)
        step(((n + 255) // 256,), (256,), args)
        return int(live.get()[0])

    return {"direct cupy": step_ms(cupy_step, steps), "direct kernel": step_ms(kernel_step, steps)}


def divergence_left(u: Any, v: Any) -> float:
    """``max|div u| / max|u|`` of face velocities, in float64."""
    u, v = u.astype(np.float64), v.astype(np.float64)
    div = (u[:, 1:] - u[:, :-1]) + (v[1:, :] - v[:-1, :])
    return float(np.abs(div).max() / max(np.abs(u).max(), np.abs(v).max()))


def random_field_rows(args: argparse.Namespace, device: Device, gpu: bool,
                      ) -> tuple[list[list[Any]], dict[str, Any]]:
    """ms of a fluid step of a fresh random field (every face a standard normal, the
    pressure zero: the solve starts cold), the ``FluidStep`` op run with ``Device.run``;
    the upload before each step is not timed."""
    size, rng = args.fluid, np.random.default_rng(5)
    shapes = {"u": (size, size + 1), "v": (size + 1, size), "density": (size, size),
              "pressure": (size, size), "divergence": (size, size),
              "scratch": (fluid_scratch(size, size),)}
    bufs = {k: device.allocate(int(np.prod(shape))) for k, shape in shapes.items()}
    refs = {k: device.ref_of(b) for k, b in bufs.items()}
    op = FluidStep(refs["u"], refs["v"], refs["density"], refs["pressure"],
                   refs["divergence"], refs["scratch"], size, size, DT,
                   pressure_tolerance=args.tolerance, graph=gpu)
    samples, left = [], []
    for _ in range(args.steps + 3):
        u, v = rng.standard_normal(shapes["u"]), rng.standard_normal(shapes["v"])
        u[:, [0, size]], v[[0, size], :] = 0, 0
        device.copy_from_numpy(bufs["u"], u.astype(np.float32).ravel())
        device.copy_from_numpy(bufs["v"], v.astype(np.float32).ravel())
        device.copy_from_numpy(bufs["pressure"], np.zeros(size * size, np.float32))
        start = time.perf_counter()
        device.run(op, timeout_secs=60)
        samples.append((time.perf_counter() - start) * 1e3)
        left.append(divergence_left(device.copy_to_numpy(bufs["u"], shape=shapes["u"]),
                                    device.copy_to_numpy(bufs["v"], shape=shapes["v"])))
    samples = samples[3:]
    row = ["random field, cold solve (op)", f"{size}^2", percentile(samples, 50),
           percentile(samples, 99), f"{max(left):.2e}"]
    return [row], {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
                   "divergence_left_max": max(left)}


def fluid_rows(args: argparse.Namespace, system: System, device: Device, gpu: bool,
               ) -> tuple[list[list[Any]], dict[str, Any]]:
    """ms a fluid step, the graph replayed and (on a GPU) the kernels one by one."""
    size = args.fluid
    rows, facts = [], {"size": size, "pressure_iterations": 40,
                       "pressure_tolerance": args.tolerance}
    modes = (True, False) if gpu else (True,)
    results, left = {}, {}
    for use_graph in modes:
        fluid = FluidSimulationActor.spawn(system, size, size, 0.0, device=device,
                                           use_graph=use_graph,
                                           pressure_tolerance=args.tolerance)
        rng = np.random.default_rng(2)
        for _ in range(64):
            x, y = (int(c) for c in rng.integers(1, size - 1, 2))
            fluid.add_velocity(x, y, float(rng.normal() * 50), float(rng.normal() * 50))
            fluid.add_density(x, y, 1.0)
        label = ("graph replay" if use_graph else "kernels one by one") if gpu \
            else "cpu backend"
        results[label] = step_ms(lambda f=fluid: f.step(DT, timeout_secs=60), args.steps)
        left[label] = divergence_left(*fluid.face_velocities(timeout_secs=60))
        fluid.stop()
    for label, samples in results.items():
        rows.append([label, f"{size}^2", percentile(samples, 50), percentile(samples, 99),
                     f"{left[label]:.2e}"])
        facts[label] = {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99),
                        "divergence_left": left[label]}
    if gpu:
        saved = percentile(results["kernels one by one"], 50) - percentile(
            results["graph replay"], 50)
        rows.append(["graph saves (ms)", "", saved, "", ""])
        facts["graph_saves_ms"] = saved
    return rows, facts


def other_rows(args: argparse.Namespace, system: System, device: Device,
               ) -> tuple[list[list[Any]], dict[str, Any]]:
    """Cloth ms a step; spatial index build and query times."""
    cloth = ClothSimulationActor.spawn(system, 64, 64, 0.02, 0.5, 8, device=device)
    cloth.pin(range(64))
    cloth_ms = step_ms(lambda: cloth.step(DT), args.steps)
    cloth.stop()
    rng = np.random.default_rng(3)
    n = args.points
    index = SpatialIndexActor.spawn(system, 1.0, device=device)
    index.insert(rng.uniform(-50, 50, (n, 3)), timeout_secs=120)
    build = step_ms(lambda: index.rebuild(timeout_secs=60), 5, warmup=1)
    queries = rng.uniform(-50, 50, (args.queries, 3))
    query = step_ms(lambda: index.query_many(queries, 1.0, timeout_secs=60), 5, warmup=1)
    index.stop()
    rows = [["cloth 64 x 64, 8 iterations (step)", percentile(cloth_ms, 50)],
            [f"spatial index: build, {n} points", percentile(build, 50)],
            [f"spatial index: {args.queries} radius queries", percentile(query, 50)]]
    facts = {"cloth_ms": percentile(cloth_ms, 50), "grid_build_ms": percentile(build, 50),
             "grid_query_ms": percentile(query, 50), "points": n, "queries": args.queries}
    return rows, facts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", help="write the results to this path")
    parser.add_argument("--quick", action="store_true", help="a small CPU smoke run")
    parser.add_argument("--particles", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--fluid", type=int, default=1024)
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="the fluid's pressure_tolerance")
    parser.add_argument("--only", default="particles,fluid,random,other",
                        help="which sections to run, comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.particles, args.fluid, args.points, args.queries, args.steps = (
            100_000, 64, 20_000, 200, 5)
    gpu = not args.quick
    payload: dict[str, Any] = {"backend": "cpu" if args.quick else "cuda"}
    with System.open("realtime-physics-bench") as system:
        device = system.spawn_device(mock=args.quick)
        only = set(args.only.split(","))
        if "particles" in only:
            rows, payload["particles"] = particle_rows(args, system, device, gpu)
            print_table(f"Particles, {args.particles} a step (dt {DT:.4f} s), ms",
                        ["path", "n", "p50 ms", "p99 ms", "GB/s", "% of 3350 GB/s"], rows)
        if "fluid" in only:
            rows, payload["fluid"] = fluid_rows(args, system, device, gpu)
            print_table(f"Fluid, pressure to {args.tolerance:g} (<= 40 iterations), ms a step "
                        "(actor call, host to host)",
                        ["path", "grid", "p50 ms", "p99 ms", "max|div u|/max|u|"], rows)
        if "random" in only:
            rows, payload["random_field"] = random_field_rows(args, device, gpu)
            print_table(f"Fluid, one step of a random field, pressure to {args.tolerance:g}",
                        ["path", "grid", "p50 ms", "p99 ms", "max|div u|/max|u| (worst)"], rows)
        if "other" in only:
            rows, payload["other"] = other_rows(args, system, device)
            print_table("Cloth and spatial index, p50 ms", ["what", "ms"], rows)
    if args.json:
        write_json(args.json, payload)


if __name__ == "__main__":
    main()
