"""Serving blueprints on a device: batching, a cascade, a hot swap and MoE routing.

    python examples/serving_demo.py
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from atomr_accel import System
from atomr_accel.patterns import (
    DynamicBatchingServer,
    InferenceCascade,
    ModelHotSwapServer,
    MoeRouter,
    Stage,
)

D_IN, D_OUT, MAX_BATCH = 16, 4, 8


async def main() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((D_IN, D_OUT)).astype(np.float32)
    async with await System.open_async("serving-demo") as system:
        dev = await system.spawn_device_async(mock=True)  # the CPU backend; mock=False: CUDA
        w_buf = await dev.allocate_f32_async(D_IN * D_OUT)
        x_buf = await dev.allocate_f32_async(MAX_BATCH * D_IN)
        y_buf = await dev.allocate_f32_async(MAX_BATCH * D_OUT)
        await dev.copy_from_numpy_async(w_buf, w)

        async def linear(xs: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
            n = len(xs)
            await dev.copy_from_numpy_async(x_buf, np.stack(xs), offset=0)
            await dev.blas().matmul_async(x_buf, w_buf, y_buf, m=n, n=D_OUT, k=D_IN)
            return await dev.copy_to_numpy_async(y_buf, length=n * D_OUT, shape=(n, D_OUT))

        batcher = DynamicBatchingServer.spawn(system, linear, max_batch=MAX_BATCH,
                                              max_wait=0.005)
        xs = [rng.standard_normal(D_IN).astype(np.float32) for _ in range(20)]
        ys = await asyncio.gather(*(batcher.submit_async(x) for x in xs))
        error = max(float(np.abs(y - x @ w).max()) for x, y in zip(xs, ys, strict=True))
        stats = await batcher.stats_async()
        print(f"batching: {stats.completed} requests in {stats.batches} batches, "
              f"max error {error:.1e}")

        cascade = InferenceCascade.spawn(system, [
            Stage(lambda x: ("small", 0.95 if x < 5 else 0.3), threshold=0.9),
            Stage(lambda x: ("large", 0.99)),
        ])
        answers = [(await cascade.infer_async(x)).answer for x in (1, 9)]
        print(f"cascade: 1 -> {answers[0]}, 9 -> {answers[1]}")

        server = ModelHotSwapServer.spawn(system, lambda x: f"v1({x})")
        before = await server.infer_async("a")
        version = await server.swap_async(lambda x: f"v2({x})")
        print(f"hot swap: {before}, then version {version}: {await server.infer_async('b')}")

        experts = [lambda rows, s=s: rows[:, :D_OUT] * s for s in (1.0, 2.0, 3.0)]
        router = MoeRouter.spawn(system, lambda x: x[:, :3], experts, top_k=2)
        print(f"moe: output shape {(await router.route_async(np.stack(xs))).shape}")


if __name__ == "__main__":
    asyncio.run(main())
