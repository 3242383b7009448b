"""BlasLt bf16 matmul + bias + GELU (8192^3) vs direct nvmath and an unfused path, side by side.

One run times, after warm-up, the median of ``--reps`` iterations of:

1. ours, blocking: ``dev.blaslt().matmul(a, b, d, m, n, k, "bias_gelu", bias=...)``, wall
   time of each call (it returns when the result is on the device);
2. ours, async: ``--inflight`` ``matmul_async`` calls gathered together, wall time per call
   of each batch (steady-state throughput);
3. direct nvmath: one planned ``nvmath.linalg.advanced.Matmul`` (the same row-major problem
   and ``GELU_BIAS`` epilogue, in place, as our handler runs it) reused, timed per execute
   with CUDA events (back to back) and as execute + stream synchronize (wall);
4. unfused: ``cupy.matmul`` (cuBLAS) followed by a separate bias + GELU kernel (NVRTC),
   timed with CUDA events and with a synchronize.

It prints a table (ms, TFLOP/s, ours/nvmath) and writes JSON to ``--json``. Goals: ours
>= 97% of direct nvmath, and faster than the unfused path.

    python benchmarks/blaslt_bench.py [--size 8192] [--reps 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from collections.abc import Callable
from typing import Any

try:
    import cupy as cp
except ImportError:  # no CuPy, so no CUDA device: main() says so and skips
    cp = None
import ml_dtypes
import numpy as np
from _report import (
    add_quick,
    cupy_event_samples,
    pipelined,
    print_table,
    require_cuda,
    wall_samples,
    write_json,
)

from atomr_accel import DType, System

_BIAS_GELU_SOURCE = r"""
extern "C" __global__ void bias_gelu_bf16(unsigned short* d, const unsigned short* bias,
                                          long long rows, long long cols) {
    long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float x = __uint_as_float(((unsigned)d[i]) << 16)
                + __uint_as_float(((unsigned)bias[i % cols]) << 16);
        float y = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
        unsigned u = __float_as_uint(y);
        u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
        d[i] = (unsigned short)(u >> 16);
    }
}
"""


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3





def synced(fn: Callable[[], Any]) -> Callable[[], None]:
    stream = cp.cuda.get_current_stream()

    def run() -> None:
        fn()
        stream.synchronize()

    return run


def unfused_gemm(advanced: Any, ca: Any, cb: Any, cd: Any,
                 stream: Any) -> tuple[Callable[[], Any], str]:
    """The unfused path's gemm ``cd = ca @ cb``: ``cupy.matmul`` (cuBLAS), or where CuPy has
    no bf16 gemm, nvmath's cuBLASLt matmul without an epilogue (and which one it is)."""
    try:
        cp.matmul(ca, cb, out=cd)
        return (lambda: cp.matmul(ca, cb, out=cd)), "cupy.matmul (cuBLAS)"
    except Exception as exc:
        print(f"cupy.matmul on bf16 failed ({type(exc).__name__}: {exc}); "
              "the unfused gemm is nvmath without an epilogue")
    plain = advanced.Matmul(cb.T, ca.T, cd.T, alpha=1.0, beta=0.0, options={"inplace": True},
                            stream=stream)
    plain.plan(stream=stream)
    return (lambda: plain.execute(stream=stream)), "nvmath, no epilogue (cuBLASLt)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--json", default="benchmarks/results/blaslt_bench.json")
    add_quick(parser, size=1024, reps=3, warm=1, inflight=2)
    args = parser.parse_args()
    require_cuda()
    m = n = k = args.size
    reps, warm = max(args.reps, 10), args.warm
    flop = 2.0 * m * n * k
    rng = np.random.default_rng(0)
    bf16 = ml_dtypes.bfloat16
    host_a = (rng.standard_normal((m, k), dtype=np.float32) / 8).astype(bf16)
    host_b = (rng.standard_normal((k, n), dtype=np.float32) / 8).astype(bf16)
    host_bias = rng.standard_normal(n, dtype=np.float32).astype(bf16)
    rows: dict[str, list[float]] = {}
    checks: dict[str, float] = {}
    failures: dict[str, str] = {}

    with System.open("blaslt-bench") as system:
        dev = system.spawn_device(mock=False)
        blaslt = dev.blaslt()
        a, b = dev.allocate(m * k, DType.BF16), dev.allocate(k * n, DType.BF16)
        d, bias = dev.allocate(m * n, DType.BF16), dev.allocate(n, DType.BF16)
        dev.copy_from_numpy(a, host_a.reshape(-1))
        dev.copy_from_numpy(b, host_b.reshape(-1))
        dev.copy_from_numpy(bias, host_bias)

        def ours() -> None:
            blaslt.matmul(a, b, d, m, n, k, "bias_gelu", bias=bias)

        rows["ours, blocking facade"] = wall_samples(ours, reps, warm)

        try:
            rows[f"ours, async ({args.inflight} in flight)"] = pipelined(
                lambda: blaslt.matmul_async(a, b, d, m, n, k, "bias_gelu", bias=bias),
                args.inflight, reps, warm)
        except Exception as exc:  # reported with the table; the other paths still run
            failures[f"ours, async ({args.inflight} in flight)"] = f"{type(exc).__name__}: {exc}"
        ours_d = dev.copy_to_numpy(d).reshape(m, n)[:64].astype(np.float64)

    advanced = importlib.import_module("nvmath.linalg.advanced")

    ca, cb, cbias = cp.asarray(host_a), cp.asarray(host_b), cp.asarray(host_bias)
    cd = cp.empty((m, n), dtype=ca.dtype)
    stream = cp.cuda.get_current_stream()
    mm = advanced.Matmul(cb.T, ca.T, cd.T, alpha=1.0, beta=0.0, options={"inplace": True},
                         stream=stream)
    mm.plan(epilog=advanced.MatmulEpilog.GELU_BIAS, epilog_inputs={"bias": cbias},
            stream=stream)

    def direct() -> None:
        mm.execute(stream=stream)

    rows["direct nvmath, back to back"] = cupy_event_samples(direct, reps, warm)
    rows["direct nvmath, execute + synchronize"] = wall_samples(synced(direct), reps, warm)

    def rebound() -> None:  # our handler's pattern: operands bound, run, released per call
        mm.reset_operands_unchecked(a=cb.T, b=ca.T, c=cd.T, alpha=1.0, beta=0.0,
                                    epilog_inputs={"bias": cbias})
        mm.execute(stream=stream)
        mm.release_operands()

    rows["direct nvmath, operands reset + released per call"] = cupy_event_samples(rebound, reps,
                                                                              warm)
    stream.synchronize()
    direct_d = cp.asnumpy(cd[:64]).astype(np.float64)
    mm.free()

    kernel = cp.RawKernel(_BIAS_GELU_SOURCE, "bias_gelu_bf16")
    du16, bias_u16 = cd.view(cp.uint16), cbias.view(cp.uint16)
    gemm, gemm_name = unfused_gemm(advanced, ca, cb, cd, stream)

    def unfused() -> None:
        gemm()
        kernel((132 * 16,), (256,), (du16, bias_u16, np.int64(m), np.int64(n)))

    label = f"unfused: {gemm_name} + bias/GELU kernel"
    rows[f"{label}, back to back"] = cupy_event_samples(unfused, reps, warm)
    rows[f"{label}, + synchronize"] = wall_samples(synced(unfused), reps, warm)
    stream.synchronize()
    unfused_d = cp.asnumpy(cd[:64]).astype(np.float64)

    scale = float(np.abs(direct_d).max())
    checks["max |ours - direct nvmath| / max |direct| (first 64 rows)"] = float(
        np.abs(ours_d - direct_d).max()) / scale
    checks["max |unfused - direct nvmath| / max |direct| (first 64 rows)"] = float(
        np.abs(unfused_d - direct_d).max()) / scale

    medians = {name: median_ms(s) for name, s in rows.items()}
    reference = {"ours, blocking facade": "direct nvmath, execute + synchronize",
                 f"ours, async ({args.inflight} in flight)": "direct nvmath, back to back"}
    table = []
    results = []
    for name, ms in medians.items():
        ratio = medians[reference[name]] / ms if reference.get(name) in medians else None
        tflops = flop / (ms / 1e3) / 1e12
        table.append([name, ms, tflops, "" if ratio is None else f"{ratio:.3f}"])
        results.append({"name": name, "median_ms": ms, "tflops": tflops,
                        "ours_over_nvmath": ratio, "samples_ms": [x * 1e3 for x in rows[name]]})
    print_table(f"bf16 matmul + bias + GELU, {m}x{n}x{k}, median of {reps} after {warm} warm-up",
                ["path", "ms", "TFLOP/s", "ours/nvmath (throughput)"], table)
    for name, value in checks.items():
        print(f"{name}: {value:.2e}")
    for name, why in failures.items():
        print(f"{name}: FAILED ({why})")
    fused = min(ms for name, ms in medians.items() if name.startswith("ours"))
    unfused_ms = medians[f"{label}, back to back"]
    print(f"ours (best) vs unfused back to back: {unfused_ms / fused:.3f}x faster")
    write_json(args.json, {"benchmark": "blaslt_bench", "m": m, "n": n, "k": k,
                           "dtype": "bf16", "epilogue": "bias_gelu", "reps": reps,
                           "warm": warm, "results": results, "checks": checks,
                           "failures": failures,
                           "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode()})


if __name__ == "__main__":
    main()
