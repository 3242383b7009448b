"""Model-parallel training steps and parameter-server pushes, side by side.

The model is an MLP of ``--layers`` Linear layers ``--width`` wide (ReLU between, 10
classes out), f32, AdamW, softmax cross-entropy, a host batch of ``--batch`` rows
each step (uploaded by the step, as a user's NumPy batch is). Rows:

* ``unsplit``: one ``ModelReplica.train_step`` on device 0;
* ``pipeline 1f1b m=M`` / ``pipeline gpipe m=M``: the layers cut in two halves on
  devices 0 and 1 (``PipelineParallelTrainer``, ``--micro-batches`` M);
* ``tensor parallel``: the Linear pairs split over devices 0 and 1
  (``TensorParallelTrainer``);
* ``parameter server``: ``push_gradient`` of ``--ps-size`` floats (upload and one
  SGD axpy on the server's device), pushes a second.

Each step answers its loss to the host (the same synchronisation for every row).
Run on a 2-GPU machine::

    PYTHONPATH=src python3 benchmarks/train_parallel_bench.py --json out.json

``--cpu`` runs everything on CPU devices (small sizes, to try the script).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
from _report import add_quick, has_cuda, print_table, wall_samples, write_json

from atomr_accel import System
from atomr_accel.train import (
    AdamW,
    AsyncParameterServer,
    CrossEntropyLoss,
    Linear,
    ModelReplica,
    PipelineParallelTrainer,
    ReLU,
    Sequential,
    TensorParallelTrainer,
)


def mlp(width: int, layers: int) -> list[Any]:
    """``layers`` Linear layers ``width`` wide with ReLU between, 10 classes out."""
    parts: list[Any] = []
    for _ in range(layers - 1):
        parts += [Linear(width, width), ReLU()]
    return [*parts, Linear(width, 10)]


def run(args: argparse.Namespace) -> dict[str, list[float]]:
    """Every row's step times, seconds."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.width)).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    layers = mlp(args.width, args.layers)
    half = 2 * (args.layers // 2)
    kwargs: dict[str, Any] = {"loss": CrossEntropyLoss(), "optimizer": AdamW(1e-4)}
    times: dict[str, list[float]] = {}
    with System.open("train-parallel-bench", op_timeout=300) as system:
        devices = [system.spawn_device(i if not args.cpu else 0, mock=args.cpu)
                   for i in range(2)]
        replica = ModelReplica.create(devices[0], Sequential(*layers), timeout_secs=300.0,
                                      **kwargs)
        times["unsplit"] = wall_samples(lambda: replica.train_step(x, y), args.steps, args.warmup)
        for kind in ("1f1b", "gpipe"):
            pipe = PipelineParallelTrainer.spawn(
                system, [Sequential(*layers[:half]), Sequential(*layers[half:])], devices,
                micro_batches=args.micro_batches, schedule=kind, **kwargs)
            times[f"pipeline {kind} m={args.micro_batches}"] = wall_samples(
                lambda p=pipe: p.step(x, y, timeout_secs=300), args.steps, args.warmup)
            pipe.stop()
        tensor = TensorParallelTrainer.spawn(system, Sequential(*layers), devices, **kwargs)
        times["tensor parallel"] = wall_samples(lambda: tensor.step(x, y, timeout_secs=300),
                                           args.steps, args.warmup)
        tensor.stop()
        gradient = rng.standard_normal(args.ps_size).astype(np.float32)
        ps = AsyncParameterServer.spawn(system, np.zeros(args.ps_size, np.float32), "sgd",
                                        lr=1e-3, max_staleness=10**9, device=devices[0])
        times["parameter server"] = wall_samples(lambda: ps.push_gradient(0, 0, gradient, 300),
                                          args.steps, args.warmup)
        ps.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--ps-size", type=int, default=1 << 24)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="CPU devices, small sizes")
    parser.add_argument("--json", help="write the results as JSON to this path")
    add_quick(parser, width=128, layers=2, batch=64, ps_size=1 << 12, steps=3, warmup=1)
    args = parser.parse_args()
    if args.quick and not args.cpu and not has_cuda():
        print("no CUDA device visible: CPU devices (--cpu)")
        args.cpu = True
    if args.cpu:
        args.width, args.batch, args.ps_size = min(args.width, 256), min(args.batch, 256), \
            min(args.ps_size, 1 << 16)
    times = run(args)
    base = statistics.median(times["unsplit"])
    rows = []
    for name, samples in times.items():
        p50 = statistics.median(samples)
        per_second = (1.0 / p50 if name == "parameter server" else args.batch / p50)
        rows.append([name, p50 * 1e3, per_second,
                     "" if name == "parameter server" else f"{base / p50:.2f}x"])
    print_table(f"MLP {args.layers} x {args.width}, batch {args.batch}, "
                f"{'CPU devices' if args.cpu else 'GPUs'} (parameter server: "
                f"{args.ps_size} floats a push)",
                ["row", "p50 ms", "samples (pushes)/s", "vs unsplit"], rows)
    if args.json:
        write_json(args.json, {"args": vars(args), "times_s": times})


if __name__ == "__main__":
    main()
