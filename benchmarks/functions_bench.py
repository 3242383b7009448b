"""Device function overhead: a user's function run inside the device's context.

Part 1 (always): the round trip of a no-op device function that takes one buffer
of 64 elements, blocking, one call at a time, against the package's own op on
the same buffer (``blas().scal``), on the thread and the process host.

Part 2 (``--cuda``): a torch MLP forward of about a millisecond (a resident
holds the model and its input), one blocking call at a time, against the same
forward called directly in this process (``float(model(x).sum())``, which waits
for the GPU), in alternating blocks of 50. Goals: at most 1.05x the direct call
on the thread host, 1.15x on the process host.

    python benchmarks/functions_bench.py [--quick] [--cuda] [--out PATH]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from _report import percentile, print_table, write_json

from atomr_accel import System

HOSTS = ("thread", "process")


def _us(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e6, percentile(samples, 99) * 1e6


def interleaved(first: Callable[[], Any], second: Callable[[], Any], reps: int,
                warm: int, block: int = 50) -> tuple[list[float], list[float]]:
    """Wall seconds of ``reps`` calls of each of two blocking calls, taken in alternating
    blocks of ``block`` calls (so that clock and load drifts touch both alike, while a GPU
    shared by two processes switches between them once a block, not once a call), after
    ``warm`` calls of each."""
    for _ in range(warm):
        first()
        second()
    a: list[float] = []
    b: list[float] = []
    while len(a) < reps:
        for call, out in ((first, a), (second, b)):
            for _ in range(min(block, reps - len(a))):
                began = time.perf_counter()
                call()
                out.append(time.perf_counter() - began)
    return a, b[:reps]


def noop_round_trips(system: System, isolation: str, cuda: bool, reps: int,
                     warm: int) -> dict[str, Any]:
    """p50/p99 of a no-op function on a 64-element buffer against ``scal`` on it."""
    dev = system.spawn_device(0, mock=not cuda, isolation=isolation)
    buf = dev.allocate_f32(64)
    blas = dev.blas()
    noop = dev.function(lambda view: None, name="noop")
    op, fn = interleaved(lambda: blas.scal_f32(1.0, buf), lambda: noop(buf), reps, warm)
    (op50, op99), (fn50, fn99) = _us(op), _us(fn)
    return {"op_p50_us": op50, "op_p99_us": op99, "function_p50_us": fn50,
            "function_p99_us": fn99, "ratio_p50": fn50 / op50}


def _mlp(width: int, depth: int, batch: int) -> Any:
    """A torch MLP on the current CUDA device and an input for it (float32, no grad)."""
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda().eval()
    return model, torch.randn(batch, width, device="cuda")


def _forward(state: tuple[Any, Any]) -> float:
    import torch

    model, x = state
    with torch.no_grad():
        return float(model(x).sum())


def mlp_forwards(system: System, isolation: str, reps: int, warm: int,
                 shape: tuple[int, int, int]) -> dict[str, Any]:
    """A ~1 ms MLP forward as a device function against the direct call in this process."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    direct_state = _mlp(*shape)
    dev = system.spawn_device(0, isolation=isolation)
    resident = dev.resident(_mlp, *shape, name="mlp")
    forward = dev.function(_forward, name="mlp_forward")
    direct, through = interleaved(lambda: _forward(direct_state), lambda: forward(resident),
                                  reps, warm)
    assert abs(forward(resident) - _forward(direct_state)) <= 1e-3 * abs(_forward(direct_state))
    (d50, d99), (f50, f99) = _us(direct), _us(through)
    return {"direct_p50_us": d50, "direct_p99_us": d99, "function_p50_us": f50,
            "function_p99_us": f99, "ratio_p50": f50 / d50}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--cuda", action="store_true",
                        help="CUDA devices, and the torch MLP part (default: CPU only)")
    parser.add_argument("--out", default="benchmarks/results/functions_bench.json")
    args = parser.parse_args()
    reps, warm = (300, 50) if args.quick else (3000, 300)
    results: dict[str, Any] = {"backend": "cuda" if args.cuda else "cpu", "reps": reps}
    rows = []
    with System.open("functions-bench") as system:
        for isolation in HOSTS:
            row = results[f"noop_{isolation}"] = noop_round_trips(
                system, isolation, args.cuda, reps, warm)
            rows.append([isolation, row["op_p50_us"], row["op_p99_us"], row["function_p50_us"],
                         row["function_p99_us"], f"{row['ratio_p50']:.2f}x"])
        print_table(f"no-op function vs scal on 64 f32 ({results['backend']}, blocking, "
                    f"{reps} calls)",
                    ["host", "op p50 us", "op p99 us", "fn p50 us", "fn p99 us", "fn/op p50"],
                    rows)
        if args.cuda:
            shape = (4096, 4, 256)  # width, depth, batch: about 1 ms on an H100 in float32
            results["mlp_shape"] = {"width": shape[0], "depth": shape[1], "batch": shape[2]}
            mlp_reps, mlp_warm = (100, 20) if args.quick else (500, 50)
            rows = []
            for isolation in HOSTS:
                row = results[f"mlp_{isolation}"] = mlp_forwards(
                    system, isolation, mlp_reps, mlp_warm, shape)
                goal = 1.05 if isolation == "thread" else 1.15
                rows.append([isolation, row["direct_p50_us"], row["direct_p99_us"],
                             row["function_p50_us"], row["function_p99_us"],
                             f"{row['ratio_p50']:.3f}x", f"<= {goal}x"])
            print_table(f"torch MLP forward {shape[0]}x{shape[1]} layers, batch {shape[2]} "
                        f"(blocking, {mlp_reps} calls)",
                        ["host", "direct p50 us", "direct p99 us", "fn p50 us", "fn p99 us",
                         "fn/direct p50", "goal"], rows)
    write_json(args.out, results)


if __name__ == "__main__":
    main()
