"""The device tier end to end: numbers checked against NumPy, a poisoned context
recovered in a fresh worker process, stale buffers refused, typed errors.

    python examples/device_demo.py
"""

from __future__ import annotations

import time

import numpy as np

from atomr_accel import ContextPoisoned, FaultKind, GpuRefStale, InvalidArgument, System


def main() -> None:
    """Run a gemm, break the context, watch it come back."""
    rng = np.random.default_rng(0)
    with System.open("device-demo") as system:
        dev = system.spawn_device(mock=True, isolation="process")
        stats = dev.stats()
        print(f"device {dev.device_id}: {dev.backend} backend, context in worker process "
              f"{stats.host_pid}, generation {stats.generation}")

        m = n = k = 64
        x = rng.standard_normal((m, k)).astype(np.float32)
        y = rng.standard_normal((k, n)).astype(np.float32)
        a, b, c = dev.allocate_f32(m * k), dev.allocate_f32(k * n), dev.allocate_f32(m * n)
        dev.copy_from_numpy(a, x)
        dev.copy_from_numpy(b, y)
        dev.blas().matmul(a, b, c, m, n, k)  # row-major helper over column-major gemm
        error = np.abs(dev.copy_to_numpy(c, shape=(m, n)) - x @ y).max()
        print(f"matmul {m}x{n}x{k}: max error vs NumPy {error:.1e}")

        try:
            dev.copy_from_numpy(a, np.zeros(m * k))  # float64 into a float32 buffer
        except InvalidArgument as exc:
            print(f"bad input is a typed error: {exc}")

        start = time.perf_counter()
        try:
            dev.inject_fault(FaultKind.POISON)
        except ContextPoisoned as exc:
            print(f"fault injected: {exc}")
        fresh = dev.allocate_f32(m * k)  # queued until the new context is up
        stats = dev.stats()
        print(f"recovered in {time.perf_counter() - start:.2f} s: worker {stats.host_pid}, "
              f"generation {stats.generation}, restarts {stats.restarts}")
        try:
            dev.copy_to_numpy(a)
        except GpuRefStale as exc:
            print(f"old buffers are refused: {exc}")
        dev.copy_from_numpy(fresh, x.reshape(-1))
        print("the new context serves:", bool((dev.copy_to_numpy(fresh) == x.reshape(-1)).all()))


if __name__ == "__main__":
    main()
