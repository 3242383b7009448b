"""A model served through DynamicBatchingServer over a device function: throughput, and
recovery when some requests take the context down.

Part 1, throughput: ``--clients`` concurrent clients send uint8 images (224 x 224 x 3 on
a GPU) to a ``DynamicBatchingServer`` (batches up to 64, ``--concurrent-batches`` of them
at once, default 2) whose batch function is a device function on a process-isolated
device: a ResNet-50 (torchvision, random weights, float16, channels-last) held as a
resident. Against it, a plain torch loop in this process over batches of 64 of the same
images (stack, upload, convert, forward, argmax). Goal: at least 0.95x the plain loop's
images/s; p50/p99 latency reported. Both paths are warmed first for every batch size
they will see (cuDNN autotunes each new shape once: the plain loop sees only batches of
64, the server batches of 1 to 64).

Part 2, recovery: the same service on a device with ``standby=1`` and a ``pure``
function, one request in ``--poison-every`` an illegal-address kernel. Every other
request must be answered with the class the plain loop gave it (a float16 argmax may
flip between two runs: reported, not hidden); ``/readyz`` is polled every 5 ms and its
503 spells give the time without service per fault. Goal: 150 ms p50.

Without a GPU (``--quick`` or no CUDA device) both parts run on the CPU backend with a
small NumPy model (8 x 8 images), the poisoned request killing its worker (the function
is not ``pure`` there: a pure call would be re-run into the same death).

    python benchmarks/functions_serving_bench.py [--quick] [--requests N] [--concurrent-batches K]
        [--out PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from _report import add_quick, has_cuda, percentile, print_table, write_json

from atomr_accel import ContextPoisoned, System
from atomr_accel.patterns import DynamicBatchingServer

POISON = "poison"
BAD_KERNEL = 'extern "C" __global__ void bad_write(int* p) { *p = 1; }'
BATCH = 64


def build_resnet() -> Any:
    """ResNet-50, random weights seeded alike everywhere, float16, channels-last, on the GPU."""
    import torch
    import torchvision

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(weights=None).eval().cuda().half()
    return model.to(memory_format=torch.channels_last)


def classify_gpu(model: Any, items: list[Any]) -> list[int]:
    """uint8 HWC images to classes on the GPU; a poison pill writes to an illegal address."""
    import cupy as cp
    import torch

    if any(isinstance(item, str) for item in items):
        cp.RawKernel(BAD_KERNEL, "bad_write")((1,), (1,), (cp.uint64(1),))
        cp.cuda.get_current_stream().synchronize()
    # host arrays (a plain loop) or CUDA tensors already uploaded (arrays="torch")
    batch = torch.stack([torch.as_tensor(item) for item in items]).cuda(non_blocking=True)
    x = batch.permute(0, 3, 1, 2).half().div_(255).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        return list(model(x).argmax(dim=1).cpu().tolist())


def build_linear() -> np.ndarray[Any, Any]:
    """The CPU model: a linear classifier's weights."""
    return np.random.default_rng(0).standard_normal((8 * 8 * 3, 10)).astype(np.float32)


def classify_cpu(weights: np.ndarray[Any, Any], items: list[Any]) -> list[int]:
    """uint8 images to classes with NumPy; a poison pill kills this worker."""
    if any(isinstance(item, str) for item in items):
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.stack(items).reshape(len(items), -1).astype(np.float32) / 255
    return list((x @ weights).argmax(axis=1).tolist())


def plain_loop(cuda: bool, images: list[Any]) -> tuple[float, list[int]]:
    """Images/s of a plain loop in this process over batches of 64, and its classes."""
    model = build_resnet() if cuda else build_linear()
    classify = classify_gpu if cuda else classify_cpu
    classify(model, images[:BATCH])  # warm up
    began = time.perf_counter()
    classes: list[int] = []
    for start in range(0, len(images), BATCH):
        classes += classify(model, images[start:start + BATCH])
    took = time.perf_counter() - began
    del model
    if cuda:
        import torch

        torch.cuda.empty_cache()
    return len(images) / took, classes


class ReadyWatch:
    """Polls ``/readyz`` every 5 ms on a thread; the 503 spells it saw, in seconds."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/readyz"
        self.spells: list[float] = []
        self.codes: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _status(self) -> int:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def _run(self) -> None:
        down: float | None = None
        while not self._stop.wait(0.005):
            code = self._status()
            self.codes.add(code)
            now = time.perf_counter()
            if code != 200 and down is None:
                down = now
            elif code == 200 and down is not None:
                self.spells.append(now - down)
                down = None

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join()


async def serve(cuda: bool, items: list[Any], clients: int, standby: int, pure: bool,
                watch: bool, concurrent: int = 1) -> dict[str, Any]:
    """Send ``items`` from ``clients`` concurrent clients; answers, latencies and outages."""
    async with await System.open_async("serving-bench") as system:
        dev = await system.spawn_device_async(mock=not cuda, isolation="process",
                                              standby=standby, max_restarts=10_000)
        model = await dev.resident_async(build_resnet if cuda else build_linear, name="model")
        fn = dev.function(classify_gpu if cuda else classify_cpu, pure=pure, name="classify",
                          arrays="torch" if cuda else "auto")
        clean = [x for x in items if not isinstance(x, str)]
        for size in range(1, BATCH + 1):  # cuDNN autotunes each batch size once: not timed
            await fn.call_async(model, clean[:size])
        server = DynamicBatchingServer.spawn(system, functools.partial(fn, model),
                                             max_batch=BATCH, max_wait=0.002,
                                             max_concurrent_batches=concurrent)
        watcher = None
        if watch:
            telemetry = await system.enable_telemetry_async(0)
            assert telemetry.port is not None
            watcher = ReadyWatch(telemetry.port)
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(items)):
            queue.put_nowait(i)
        answers: list[Any] = [None] * len(items)
        latencies: list[float] = []

        async def client() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                began = time.perf_counter()
                try:
                    answers[i] = await server.submit_async(items[i], timeout_secs=300)
                except Exception as exc:
                    answers[i] = exc
                latencies.append(time.perf_counter() - began)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        took = time.perf_counter() - began
        if watcher is not None:
            await asyncio.sleep(0.05)
            watcher.stop()
        stats = await dev.stats_async()
        return {"answers": answers, "seconds": took, "latencies": latencies,
                "restarts": stats.restarts,
                "outages": watcher.spells if watcher else [],
                "readyz_codes": sorted(watcher.codes) if watcher else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4096)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--poison-every", type=int, default=200)
    parser.add_argument("--cpu", action="store_true", help="the CPU backend even with a GPU")
    parser.add_argument("--concurrent-batches", type=int, default=2,
                        help="the server's max_concurrent_batches in part 1 (2, as "
                             "docs/patterns.md advises for a device function: the next "
                             "batch's images cross while the device computes)")
    parser.add_argument("--out", default="benchmarks/results/functions_serving_bench.json")
    add_quick(parser, requests=400, clients=32, cpu=True)
    args = parser.parse_args()
    cuda = has_cuda() and not args.cpu
    side = 224 if cuda else 8
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
              for _ in range(args.requests)]
    loop_rate, expected = plain_loop(cuda, images)
    served = asyncio.run(serve(cuda, list(images), args.clients, 0, False, False,
                               args.concurrent_batches))
    rate = len(images) / served["seconds"]
    lat = served["latencies"]
    wrong = sum(a != e for a, e in zip(served["answers"], expected, strict=True))
    card = "cpu"
    if cuda:
        import torch

        card = torch.cuda.get_device_name()
    print_table(f"throughput ({card}, {args.requests} requests, {args.clients} clients, "
                f"batches up to {BATCH}, {args.concurrent_batches} at once)",
                ["path", "images/s", "vs plain loop", "p50 ms", "p99 ms", "differing classes"],
                [["plain torch loop" if cuda else "plain NumPy loop", loop_rate, "1.00x", "",
                  "", ""],
                 ["DynamicBatchingServer over a device function", rate,
                  f"{rate / loop_rate:.2f}x (goal 0.95x)", percentile(lat, 50) * 1e3,
                  percentile(lat, 99) * 1e3, wrong]])
    items: list[Any] = list(images)
    poisoned = set(range(args.poison_every - 1, len(items), args.poison_every))
    for i in poisoned:
        items[i] = POISON
    # pure on a GPU, where the request that faults is blamed and the others re-run; on the
    # CPU the poisoned request kills its worker, which a pure call would re-run into again
    faulty = asyncio.run(serve(cuda, items, args.clients, 1, cuda, True))
    answers = faulty["answers"]
    lost = sum(1 for i, a in enumerate(answers) if i not in poisoned and isinstance(a, Exception))
    poison_typed = sum(1 for i in poisoned if isinstance(answers[i], ContextPoisoned))
    differing = sum(1 for i, a in enumerate(answers)
                    if i not in poisoned and not isinstance(a, Exception) and a != expected[i])
    outages = faulty["outages"]
    print_table(f"recovery ({card}): one request in {args.poison_every} poisons the context, "
                f"standby=1, pure={cuda}",
                ["requests", "poisoned", "poisoned failed typed", "others lost",
                 "others differing", "rebuilds", "outages seen", "outage p50 ms",
                 "outage max ms", "/readyz codes"],
                [[len(items), len(poisoned), poison_typed, lost, differing, faulty["restarts"],
                  len(outages), percentile(outages, 50) * 1e3 if outages else "",
                  max(outages) * 1e3 if outages else "", faulty["readyz_codes"]]])
    write_json(args.out, {
        "card": card, "requests": args.requests, "clients": args.clients,
        "concurrent_batches": args.concurrent_batches,
        "plain_loop_images_per_s": loop_rate, "served_images_per_s": rate,
        "ratio": rate / loop_rate, "p50_ms": percentile(lat, 50) * 1e3,
        "p99_ms": percentile(lat, 99) * 1e3, "differing_classes": wrong,
        "recovery": {"poisoned": len(poisoned), "poisoned_failed_typed": poison_typed,
                     "others_lost": lost, "others_differing": differing,
                     "rebuilds": faulty["restarts"], "outages_ms": [o * 1e3 for o in outages],
                     "readyz_codes": faulty["readyz_codes"]}})


if __name__ == "__main__":
    main()
