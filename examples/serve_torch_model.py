"""Serve a model through DynamicBatchingServer over a device function, and survive a
request that takes the GPU context down.

    python examples/serve_torch_model.py [--requests 256] [--cpu]

With a GPU (and torch, torchvision, CuPy): a torchvision ResNet-50 with random weights
(no download), in float16 and channels-last, lives as a resident inside a
process-isolated device with a warm standby; requests are 224 x 224 RGB images
(uint8). One request carries a poison pill: the model launches a kernel that writes
to an illegal address, the sticky CUDA fault that ruins a process's context. The
batch it rode in fails with ``ContextPoisoned``; the server finds that request on
the rebuilt context, so it alone fails, and every other request gets its class.

Without a GPU (or with ``--cpu``) the same service runs on the CPU backend with a
small NumPy model, and the poisoned request kills the worker process it runs in, as
a segfault in a native library would.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import signal
import time
from typing import Any

import numpy as np

from atomr_accel import ContextPoisoned, System
from atomr_accel.patterns import DynamicBatchingServer

POISON = "poison"
BAD_KERNEL = 'extern "C" __global__ void bad_write(int* p) { *p = 1; }'


def build_resnet() -> Any:
    """The resident: a ResNet-50 (random weights) on the context's GPU."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50(weights=None).eval().cuda().half()
    return model.to(memory_format=torch.channels_last)


def classify_on_gpu(model: Any, items: list[Any]) -> list[int]:
    """The batch function, run inside the device's context: uint8 images in, classes out."""
    import cupy as cp
    import torch

    if any(isinstance(item, str) and item == POISON for item in items):
        cp.RawKernel(BAD_KERNEL, "bad_write")((1,), (1,), (cp.uint64(1),))
        cp.cuda.get_current_stream().synchronize()  # the fault surfaces here
    images = [torch.as_tensor(item) for item in items if not isinstance(item, str)]
    batch = torch.stack(images).cuda(non_blocking=True)  # uploaded already (arrays="torch")
    x = batch.permute(0, 3, 1, 2).half().div_(255).contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        classes = model(x).argmax(dim=1).cpu().tolist()
    return classes if len(classes) == len(items) else [-1] * len(items)


def build_numpy_model() -> np.ndarray[Any, Any]:
    """The resident on the CPU backend: the weights of a linear classifier."""
    return np.random.default_rng(0).standard_normal((8 * 8 * 3, 10)).astype(np.float32)


def classify_on_cpu(weights: np.ndarray[Any, Any], items: list[Any]) -> list[int]:
    """The CPU batch function: a poisoned request kills the worker it runs in."""
    if any(isinstance(item, str) and item == POISON for item in items):
        os.kill(os.getpid(), signal.SIGKILL)
    x = np.stack(items).reshape(len(items), -1).astype(np.float32) / 255
    return (x @ weights).argmax(axis=1).tolist()


def gpu_visible() -> bool:
    """True when torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


async def serve(requests: int, cuda: bool) -> int:
    """Send ``requests`` images (one of them the poison pill) and count the answers."""
    side = 224 if cuda else 8
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(requests)]
    items: list[Any] = list(images)
    items[requests // 2] = POISON
    async with await System.open_async("serve-model") as system:
        dev = await system.spawn_device_async(
            mock=not cuda, isolation="process", standby=1, max_restarts=10)
        model = await dev.resident_async(build_resnet if cuda else build_numpy_model,
                                         name="model")
        classify = dev.function(classify_on_gpu if cuda else classify_on_cpu, name="classify",
                                arrays="torch" if cuda else "auto")  # images as CUDA tensors
        await classify.call_async(model, images[:2])  # warm up (cuDNN picks its kernels)
        server = DynamicBatchingServer.spawn(  # the batch runs inside the worker
            system, functools.partial(classify, model), max_batch=64, max_wait=0.005)
        began = time.perf_counter()
        answers = await asyncio.gather(
            *(server.submit_async(item, timeout_secs=120) for item in items),
            return_exceptions=True)
        took = time.perf_counter() - began
        served = sum(isinstance(a, int) for a in answers)
        poisoned = [i for i, a in enumerate(answers) if isinstance(a, ContextPoisoned)]
        other = [a for a in answers if not isinstance(a, int | ContextPoisoned)]
        stats = await dev.stats_async()
        print(f"{'cuda' if cuda else 'cpu'}: {served} of {requests} requests answered in "
              f"{took:.2f} s; failed with ContextPoisoned: requests {poisoned}; other errors: "
              f"{len(other)}; context generation {stats.generation} "
              f"({stats.restarts} rebuilds), worker pid {stats.host_pid}")
        ok = served == requests - 1 and poisoned == [requests // 2] and not other
        return 0 if ok else 1


def main() -> None:
    """Run the service once and exit 0 when only the poisoned request failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--cpu", action="store_true", help="the CPU backend, even with a GPU")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(serve(args.requests, gpu_visible() and not args.cpu)))


if __name__ == "__main__":
    main()
