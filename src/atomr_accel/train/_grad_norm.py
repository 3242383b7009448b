"""The L2 norm of gradients spread over several replicas, computed on their devices."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

from atomr_accel.core.ops._blas_vectors import Nrm2
from atomr_accel.train._replica import ModelReplica
from atomr_accel.train._replica_state import gather

__all__ = ["gradient_norm"]


async def gradient_norm(replicas: Iterable[ModelReplica]) -> float:
    """``sqrt(sum |g|^2)`` over every gradient bucket of ``replicas``: one BLAS nrm2 a
    bucket on its device, a replica's as one request, the replicas at once (only the
    norms come back)."""
    norms = await asyncio.gather(*(
        gather([replica._run(Nrm2(len(bucket), bucket.ref)) for bucket in replica.grads])
        for replica in replicas))
    return math.sqrt(sum(float(norm) ** 2 for replica in norms for norm in replica))
