"""One replica's training step against the same model in eager PyTorch, on one device.

The model is an MLP of ``--layers`` Linear layers ``--width`` wide (ReLU between,
10 classes out), f32, AdamW, softmax cross-entropy, a batch of ``--batch``
rows already on the device. Rows:

* ``ModelReplica.train_step``: the whole step submitted back to back, awaited once
  (the loss read back each step);
* ``ModelReplica, awaited per call``: zero_grad, forward, loss, backward and the
  optimizer step each awaited;
* ``torch eager``: ``zero_grad``, forward, ``CrossEntropyLoss``, ``backward``,
  ``AdamW.step`` (foreach), ``loss.item()`` each step (same synchronisation).

Neither side uses TF32. Run on a GPU machine::

    PYTHONPATH=src python3 benchmarks/train_core_bench.py --json out.json

``--cpu`` runs the replica rows on the CPU backend instead (small sizes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, has_cuda, print_table, write_json

from atomr_accel import System
from atomr_accel.train import AdamW, CrossEntropyLoss, Linear, ModelReplica, ReLU, Sequential


def mlp(width: int, layers: int) -> Sequential:
    """``layers`` Linear layers ``width`` wide with ReLU between, 10 classes out."""
    parts: list[Any] = []
    for _ in range(layers - 1):
        parts += [Linear(width, width), ReLU()]
    return Sequential(*parts, Linear(width, 10))


def timed(step: Callable[[], object], warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` calls of ``step`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        out.append(time.perf_counter() - started)
    return out


def ours(args: argparse.Namespace, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any],
         ) -> dict[str, list[float]]:
    with System.open("train-bench") as system:
        device = system.spawn_device(mock=args.cpu)
        replica = ModelReplica.create(device, mlp(args.width, args.layers),
                                      loss=CrossEntropyLoss(), optimizer=AdamW(1e-4),
                                      timeout_secs=120.0)
        xbuf = device.allocate(x.size, "f32")
        device.copy_from_numpy(xbuf, x.reshape(-1))

        def parts() -> None:
            replica.zero_grad()
            replica.forward(xbuf)
            replica.compute_loss(y)
            replica.backward()
            replica.optimizer_step()

        return {
            "ModelReplica.train_step": timed(lambda: replica.train_step(xbuf, y),
                                             args.warmup, args.steps),
            "ModelReplica, awaited per call": timed(parts, args.warmup, args.steps),
        }


def torch_eager(args: argparse.Namespace, x: np.ndarray[Any, Any],
                y: np.ndarray[Any, Any]) -> dict[str, list[float]]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    layers: list[Any] = []
    for _ in range(args.layers - 1):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).cuda()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    criterion = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).long().cuda()

    def step() -> float:
        opt.zero_grad()
        loss = criterion(net(tx), ty)
        loss.backward()
        opt.step()
        return float(loss.item())

    return {"torch eager": timed(step, args.warmup, args.steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--cpu", action="store_true", help="the replica on the CPU backend")
    parser.add_argument("--json", default=None)
    add_quick(parser, width=256, layers=2, batch=64, steps=3, warmup=1)
    args = parser.parse_args()
    if args.quick and not args.cpu and not has_cuda():
        print("no CUDA device visible: the CPU backend only (--cpu)")
        args.cpu = True
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.width)).astype(np.float32)
    y = rng.integers(0, 10, args.batch).astype(np.int64)
    results = ours(args, x, y)
    if not args.cpu:
        results |= torch_eager(args, x, y)
    flops = 6 * args.batch * ((args.layers - 1) * args.width ** 2 + args.width * 10)
    base = statistics.median(results["torch eager"]) if "torch eager" in results else None
    rows = []
    for name, samples in results.items():
        median = statistics.median(samples)
        rows.append([name, median * 1e3, min(samples) * 1e3, args.batch / median,
                     flops / median / 1e12, "" if base is None else f"{base / median:.3f}"])
    print_table(f"train step, MLP {args.layers} x {args.width}, batch {args.batch}, f32, "
                f"AdamW ({'cpu' if args.cpu else 'cuda'})",
                ["implementation", "median ms", "best ms", "samples/s", "TFLOP/s",
                 "vs torch"], rows)
    if args.json:
        write_json(args.json, {"benchmark": "train_core", "args": vars(args),
                               "results": {k: v for k, v in results.items()}})


if __name__ == "__main__":
    main()
