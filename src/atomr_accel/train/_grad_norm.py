"""The L2 norm of gradients spread over several replicas, computed on their devices."""

from __future__ import annotations

import math
from collections.abc import Iterable

from atomr_accel.train._replica import ModelReplica

__all__ = ["gradient_norm"]


async def gradient_norm(replicas: Iterable[ModelReplica]) -> float:
    """``sqrt(sum |g|^2)`` over every gradient bucket of ``replicas``: one BLAS nrm2 a
    bucket on its device (only the norms come back)."""
    total = 0.0
    for replica in replicas:
        blas = replica.device.blas()
        for bucket in replica.grads:
            norm = await blas.nrm2_async(len(bucket), bucket)
            total += float(norm) ** 2
    return math.sqrt(total)
