"""Data-parallel training: scaling from 1 to ``--gpus`` GPUs (2 unless said), ours and
TorchModule beside PyTorch DDP, and the cost of recovering a killed replica.

The model is an MLP of ``--layers`` Linear layers ``--width`` wide (ReLU between), f32,
SGD with momentum 0.9, MSE toward random targets, ``--batch`` rows a GPU (the global
batch is ``batch x GPUs``). Every variant gets its batch as a host NumPy array each step
(the upload is part of the step) and reads the loss back each step:

* ``ours``: ``DataParallelTrainer`` over ``ModelReplica``s (our ops, our all-reduce in
  per-layer buckets submitted as backward completes each), thread host (``--isolation
  process``: process host);
* ``TorchModule``: the same trainer over a ``torch.nn.Sequential`` (torch's forward,
  backward and fused SGD; our all-reduce of 25 MiB buckets, started per bucket);
* ``ModelReplica.train_step``: one replica on one GPU, no trainer (the step as one
  request of ops, its upload and its loss's download);
* ``torch``: a plain loop on one GPU; ``torch DDP``: ``DistributedDataParallel`` in
  ``--gpus`` processes started with ``torch.multiprocessing`` (NCCL, fused SGD).

Scaling is samples/s on 2 GPUs over samples/s on 1 GPU of the same variant. Recovery:
``ours`` on the process host with a standby worker per device; a step during which
replica 1's worker is SIGKILLed against the median normal step, and the final loss of a
run with a kill at its middle against an undisturbed run on the same batches. bf16 is
not measured: the training core keeps f32 (or f64) parameters.

Goals: ours >= 0.9x DDP on 2 GPUs; ModelReplica.train_step >= 0.9x the torch loop;
scaling >= 1.9x; TorchModule >= 95% of DDP's throughput; a killed
replica costs <= 3 s and the final loss is within noise of an undisturbed run.

    NCCL_NVLS_ENABLE=0 python benchmarks/train_bench.py [--json PATH] [--steps N]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import socket
import statistics
import tempfile
import time
from typing import Any

import numpy as np
from _report import add_quick, print_table, require_cuda, write_json

from atomr_accel import System
from atomr_accel.backends import cuda_device_count
from atomr_accel.train import (
    SGD,
    DataParallelTrainer,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    TorchModule,
)

Array = np.ndarray[Any, Any]
LR = 1e-3


def mlp(width: int, layers: int) -> Sequential:
    """``layers`` Linear layers ``width`` wide with ReLU between."""
    parts: list[Any] = []
    for index in range(layers):
        parts.append(Linear(width, width))
        if index < layers - 1:
            parts.append(ReLU())
    return Sequential(*parts)


def torch_mlp(torch: Any, width: int, layers: int) -> Any:
    """The same MLP in torch."""
    parts: list[Any] = []
    for index in range(layers):
        parts.append(torch.nn.Linear(width, width))
        if index < layers - 1:
            parts.append(torch.nn.ReLU())
    return torch.nn.Sequential(*parts)


def data(rows: int, width: int, seed: int = 0) -> tuple[Array, Array]:
    """A host batch and its targets."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, width), dtype=np.float32),
            rng.standard_normal((rows, width), dtype=np.float32))


def time_steps(step: Any, warmup: int, steps: int) -> float:
    """Steps a second of ``step()`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - start)


def ours(system: System, model: Any, gpus: int, args: argparse.Namespace) -> float:
    """Steps/s of a DataParallelTrainer of ``model`` on ``gpus`` GPUs."""
    devices = [system.spawn_device(i, mock=False, isolation=args.isolation)
               for i in range(gpus)]
    trainer = DataParallelTrainer.spawn(system, model, loss=MSELoss(),
                                        optimizer=SGD(lr=LR, momentum=0.9), devices=devices)
    trainer.ready(timeout_secs=300)
    x, y = data(args.batch * gpus, args.width)
    rate = time_steps(lambda: trainer.step(x, y, timeout_secs=120), args.warmup, args.steps)
    trainer.stop()
    return rate


def replica_single(system: System, args: argparse.Namespace) -> float:
    """Steps/s of ``ModelReplica.train_step`` on GPU 0 (no trainer actor, no all-reduce)."""
    device = system.spawn_device(0, mock=False, isolation=args.isolation)
    replica = ModelReplica.create(device, mlp(args.width, args.layers), loss=MSELoss(),
                                  optimizer=SGD(lr=LR, momentum=0.9))
    x, y = data(args.batch, args.width)
    return time_steps(lambda: replica.train_step(x, y), args.warmup, args.steps)


def torch_single(args: argparse.Namespace) -> float:
    """Steps/s of a plain torch loop on GPU 0 (same data path: NumPy in, loss out)."""
    import torch

    torch.manual_seed(0)
    model = torch_mlp(torch, args.width, args.layers).cuda()
    optim = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, fused=True)
    x, y = data(args.batch, args.width)

    def step() -> float:
        optim.zero_grad(set_to_none=False)
        out = model(torch.from_numpy(x).cuda(non_blocking=True))
        loss = torch.nn.functional.mse_loss(out, torch.from_numpy(y).cuda(non_blocking=True))
        loss.backward()
        optim.step()
        return float(loss.item())

    return time_steps(step, args.warmup, args.steps)


def _ddp_worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch_mlp(torch, args.width, args.layers).cuda(), device_ids=[rank],
        gradient_as_bucket_view=True)
    optim = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, fused=True)
    x, y = data(args.batch, args.width, seed=rank)

    def step() -> float:
        optim.zero_grad(set_to_none=False)
        out_ = model(torch.from_numpy(x).cuda(non_blocking=True))
        loss = torch.nn.functional.mse_loss(out_, torch.from_numpy(y).cuda(non_blocking=True))
        loss.backward()
        optim.step()
        return float(loss.item())

    for _ in range(args.warmup):
        step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    rate = args.steps / (time.perf_counter() - start)
    if rank == 0:
        with open(out, "w") as file:
            file.write(str(rate))
    dist.destroy_process_group()


def torch_ddp(gpus: int, args: argparse.Namespace) -> float:
    """Steps/s of DDP over ``gpus`` processes (each with ``--batch`` rows)."""
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.NamedTemporaryFile(suffix=".rate", delete=False) as file:
        out = file.name
    mp.spawn(_ddp_worker, args=(gpus, port, args, out), nprocs=gpus, join=True)
    with open(out) as file:
        rate = float(file.read())
    os.unlink(out)
    return rate


def recovery(system: System, args: argparse.Namespace) -> dict[str, float]:
    """A kill mid-step on the process host (standby workers): the step's wall time against
    the median normal step, and the final loss against an undisturbed run."""
    model = mlp(args.width, args.layers)
    batches = [data(args.batch * 2, args.width, seed=s) for s in range(args.recovery_steps)]

    def run(kill_at: int | None) -> tuple[float, float, float, int]:
        """(median normal step, the killed step, final loss, replicas rebuilt)."""
        devices = [system.spawn_device(i, mock=False, isolation="process", standby=1)
                   for i in range(2)]
        trainer = DataParallelTrainer.spawn(system, model, loss=MSELoss(),
                                            optimizer=SGD(lr=LR, momentum=0.9),
                                            devices=devices)
        trainer.ready(timeout_secs=300)
        for device in devices:  # the spares are up before the kill
            deadline = time.monotonic() + 120
            while not device.stats().standby_ready and time.monotonic() < deadline:
                time.sleep(0.05)
        times: list[float] = []
        killed, last = 0.0, 0.0
        for index, (x, y) in enumerate(batches):
            start = time.perf_counter()
            if index == kill_at:
                last = float(system._portal.call(killed_step(trainer, devices[1], x, y)))
                killed = time.perf_counter() - start
            else:
                last = float(trainer.step(x, y, timeout_secs=120))
                times.append(time.perf_counter() - start)
        rebuilt = trainer.stats().recoveries
        trainer.stop()
        return statistics.median(times[2:]), killed, last, rebuilt

    normal, _, undisturbed, _ = run(None)
    median, killed, disturbed, rebuilt = run(args.recovery_steps // 2)
    return {"normal_step_s": median, "killed_step_s": killed, "undisturbed_normal_step_s": normal,
            "final_loss_undisturbed": undisturbed, "final_loss_killed": disturbed,
            "replicas_rebuilt": float(rebuilt)}


async def killed_step(trainer: DataParallelTrainer, device: Any, x: Array, y: Array) -> Any:
    """A step during which ``device``'s worker is SIGKILLed (5 ms after it starts)."""
    pid = (await device.stats_async()).host_pid
    step = asyncio.ensure_future(trainer.step_async(x, y, timeout_secs=120))
    await asyncio.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    return await step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the results as JSON here")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1024, help="rows a GPU")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--recovery-steps", type=int, default=12)
    parser.add_argument("--isolation", default="thread", choices=["thread", "process"],
                        help="the host of ours and TorchModule's devices")
    parser.add_argument("--skip", default="", help="comma list of: ddp, torchmodule, recovery")
    parser.add_argument("--gpus", type=int, default=2,
                        help="GPUs of the multi-GPU rows (at most the machine's)")
    add_quick(parser, width=512, layers=2, batch=128, steps=3, warmup=1, recovery_steps=3)
    args = parser.parse_args()
    require_cuda()
    skip = set(filter(None, args.skip.split(",")))
    gpus = min(args.gpus, cuda_device_count())
    if gpus < 1:
        raise SystemExit("train_bench needs a CUDA GPU")
    import torch

    results: dict[str, Any] = {"width": args.width, "layers": args.layers,
                               "batch_per_gpu": args.batch, "gpus": gpus}
    rows: list[list[Any]] = []
    with System.open("train-bench") as system:
        variants: list[tuple[str, Any]] = [("ours", mlp(args.width, args.layers))]
        if "torchmodule" not in skip:
            torch.manual_seed(0)
            variants.append(("TorchModule",
                             TorchModule(torch_mlp(torch, args.width, args.layers))))
        for label, model in variants:
            one = ours(system, model, 1, args)
            two = ours(system, model, gpus, args) if gpus > 1 else float("nan")
            print(f"{label}: 1 GPU {one:.2f} steps/s, {gpus} GPUs {two:.2f} steps/s", flush=True)
            results[label] = {"steps_per_s_1gpu": one, f"steps_per_s_{gpus}gpu": two}
            rows.append([label, one, one * args.batch, two, two * args.batch * gpus,
                         f"{two * gpus / one:.2f}x"])
        replica_one = replica_single(system, args)
        torch_one = torch_single(args)
        ddp = torch_ddp(gpus, args) if "ddp" not in skip and gpus > 1 else float("nan")
        print(f"torch: 1 GPU {torch_one:.2f} steps/s, DDP {gpus} GPUs {ddp:.2f} steps/s",
              flush=True)
        results["torch"] = {"steps_per_s_1gpu": torch_one, f"steps_per_s_{gpus}gpu": ddp}
        rows.append(["torch / DDP", torch_one, torch_one * args.batch, ddp,
                     ddp * args.batch * gpus, f"{ddp * gpus / torch_one:.2f}x"])
        results["replica"] = {"steps_per_s_1gpu": replica_one}
        rows.append(["ModelReplica.train_step", replica_one, replica_one * args.batch,
                     float("nan"), float("nan"), ""])
        print_table(f"data-parallel MLP {args.layers}x{args.width} f32, batch {args.batch}/GPU, "
                    f"SGD momentum (steps/s, samples/s)",
                    ["what", "1 GPU steps/s", "1 GPU samples/s", f"{gpus} GPU steps/s",
                     f"{gpus} GPU samples/s", "scaling"], rows)
        ratios = {"ModelReplica step / torch loop (1 GPU, goal 0.9)": replica_one / torch_one,
                  f"ours / DDP ({gpus} GPUs, goal 0.9)": results["ours"][
                      f"steps_per_s_{gpus}gpu"] / ddp}
        results["ratios"] = ratios
        print_table("ratios in this run", ["what", "ratio"],
                    [[k, f"{v:.2f}"] for k, v in ratios.items()])
        if "TorchModule" in results and not math.isnan(ddp):
            share = results["TorchModule"][f"steps_per_s_{gpus}gpu"] / ddp
            results["torchmodule_vs_ddp"] = share
            print(f"TorchModule on {gpus} GPUs: {100 * share:.1f}% of DDP's throughput "
                  f"(goal 95%)")
        if "recovery" not in skip and gpus > 1:
            rec = recovery(system, args)
            results["recovery"] = rec
            print_table("recovery of a replica whose worker is SIGKILLed mid-step "
                        "(process host, standby=1)", ["what", "value"],
                        [["normal step (s, median)", rec["normal_step_s"]],
                         ["step with the kill (s)", rec["killed_step_s"]],
                         ["cost of the kill (s)", rec["killed_step_s"] - rec["normal_step_s"]],
                         ["replicas rebuilt", rec["replicas_rebuilt"]],
                         ["final loss, undisturbed", f"{rec['final_loss_undisturbed']:.6f}"],
                         ["final loss, killed at the middle",
                          f"{rec['final_loss_killed']:.6f}"]])
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()
