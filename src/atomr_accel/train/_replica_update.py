"""The update side of a ``ModelReplica``: zeroing the gradients, the fused optimizer
updates, and the second half of a data-parallel trainer's step (``finish_step_ops``).

**A trainer's step in two halves.** ``ModelReplica.gradient_phase_ops`` zeroes the
replica's *step stats*, a 3-element buffer of its dtype (``step_stats``:
``[loss_sum, grad_sumsq, apply_flag]``), and adds each micro-batch's ``rows * loss``
into ``loss_sum`` on the device. The trainer all-reduces the gradients and
the stats (several replicas), then ``finish_step_ops`` runs ``GradCheck`` (the
summed gradient's sum of squares, and the flag: loss sum and sum of squares
finite), the optimizer updates gated on that flag (nothing changes where it is 0)
and one download of the three stats: the step's only read-back. The host step
count advances with the update ops, as ``optimizer_step_async``'s does, and goes
back when the flag comes back 0, so a refused step leaves the replica as it was
(the learning-rate schedule, SGD's first step and Adam's bias correction follow the
step count, the only host state an update changes).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from atomr_accel.blueprint import twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._train import (
    HYPER_LENGTH,
    STATS_LENGTH,
    AdamUpdate,
    FillZeros,
    GradCheck,
    SgdUpdate,
    hyper_values,
)
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.train._model import Array
from atomr_accel.train._optim import SGD, Adam
from atomr_accel.train._replica_state import ReplicaState, Thunk, gather, require_real

__all__ = ["ReplicaUpdates"]

_HYPER = ("hyper",)
"""The work-buffer key of the update's ``hyper_values`` (``ReplicaUpdates._hyper``)."""


class ReplicaUpdates(ReplicaState):
    """``ReplicaState`` with the optimizer: zeroing, the fused updates (plain or gated on
    a step's flag) and the check-and-update half of a trainer's step (module doc)."""

    _stats: GpuBuffer | None = None

    @property
    def step_stats(self) -> GpuBuffer:
        """The stats of the last ``gradient_phase_ops``: ``[loss_sum, grad_sumsq,
        apply_flag]`` in the replica's dtype (the module docstring tells who writes
        each); ``InvalidArgument`` before the first."""
        if self._stats is None:
            raise InvalidArgument("no gradient phase yet: call gradient_phase_ops first")
        return self._stats

    def _zero_ops(self) -> list[Thunk]:
        return [self._run(FillZeros(g.ref)) for g in self.grads]

    async def zero_grad_async(self) -> None:
        """Set every gradient to zero."""
        await gather(self._zero_ops())

    zero_grad = twin(zero_grad_async, on_loop=True)

    def _scalars_vary(self) -> bool:
        """Whether the update's scalars change from step to step (Adam's bias corrections,
        a schedule's learning rate): they then reach the device in a ``hyper`` buffer, so
        that the update ops are the same every step (and replayed as a recorded graph)."""
        opt = self.optimizer
        return isinstance(opt, Adam) or opt.schedule is not None

    async def _hyper(self) -> GpuBuffer | None:
        """The buffer of the update's ``hyper_values`` (made on first use), None where the
        scalars do not vary."""
        if not self._scalars_vary():
            return None
        return await self._buffer(_HYPER, HYPER_LENGTH, DType.F64)

    def _hyper_made(self) -> GpuBuffer | None:
        """The ``hyper`` buffer ``_hyper`` made, where the scalars vary; else None."""
        return self._work.get(_HYPER) if self._scalars_vary() else None

    def _hyper_uploads(self) -> list[Thunk]:
        """The upload of the coming update's ``hyper_values`` (its step not counted yet)
        into the ``hyper`` buffer, which ``_hyper`` made; none where the scalars do not
        vary. It goes first in a step, beside the batch's uploads: the updates then join
        the backward's sequence, and a trainer's second half waits for no upload."""
        hyper = self._hyper_made()
        if hyper is None:
            return []
        opt = self.optimizer
        betas = opt.betas if isinstance(opt, Adam) else (0.0, 0.0)
        values = hyper_values(opt.lr_at(self.step), self.step + 1, *betas)
        return [self._upload(hyper, np.array(values, dtype=np.float64))]

    def _update_ops(self, grad_scale: float, gate: GpuRef | None = None) -> list[Thunk]:
        """One fused update a bucket (applied only where ``gate[2] != 0`` when given);
        advances the step count. Where the scalars vary, the ops read them from the
        ``hyper`` buffer (``_hyper_uploads`` fills it), so they are the same every step."""
        opt = self.optimizer
        hyper = self._hyper_made()
        ref = None if hyper is None else hyper.ref
        lr = opt.lr if ref is not None else opt.lr_at(self.step)  # fixed when hyper's is read
        ops: list[Op] = []
        for b, (p, g) in enumerate(zip(self.params, self.grads, strict=True)):
            if isinstance(opt, SGD):
                buf = self.optimizer_state["momentum_buffer"][b].ref if opt.momentum else None
                ops.append(SgdUpdate(p.ref, g.ref, buf, 0, len(p), lr, opt.momentum,
                                     opt.nesterov, opt.weight_decay, grad_scale,
                                     self.step == 0, gate=gate, hyper=ref))
            else:
                assert isinstance(opt, Adam)  # AdamW is an Adam
                ops.append(AdamUpdate(p.ref, g.ref, self.optimizer_state["exp_avg"][b].ref,
                                      self.optimizer_state["exp_avg_sq"][b].ref, 0, len(p),
                                      lr, 1 if ref is not None else self.step + 1,
                                      opt.betas[0], opt.betas[1], opt.eps,
                                      opt.weight_decay, opt.decoupled, grad_scale,
                                      gate=gate, hyper=ref))
        self.step += 1
        return [self._run(op) for op in ops]

    async def optimizer_step_async(self, *, grad_scale: float = 1.0) -> None:
        """Apply one fused optimizer update per bucket, the gradients multiplied by
        ``grad_scale`` first; the step count (and the schedule's learning rate) advances."""
        require_real("grad_scale", grad_scale)
        await self._hyper()
        await gather([*self._hyper_uploads(), *self._update_ops(float(grad_scale))])

    optimizer_step = twin(optimizer_step_async, on_loop=True)

    def finish_step_ops(self) -> list[Thunk]:
        """The second half of a data-parallel trainer's step, once the gradients and
        ``step_stats`` hold their sums over the replicas: ``GradCheck``, the optimizer
        update gated on its flag and the download of ``step_stats``, as calls to start
        in order (``gather``); the last answers the three stats as a host array. The step
        count advances, and goes back if the flag comes back 0 (nothing was applied).
        ``gradient_phase_ops`` wrote the update's ``hyper`` values where it has any."""
        stats = self.step_stats
        before = self.step
        check = self._run(GradCheck(tuple(g.ref for g in self.grads), stats.ref))
        update = self._update_ops(1.0, gate=stats.ref)
        return [check, *update, partial(self._settle_step, stats, before)]

    async def _settle_step(self, stats: GpuBuffer, before: int) -> Array:
        values: Array = await self.device.copy_to_numpy_async(
            stats, 0, STATS_LENGTH, timeout_secs=self._timeout)
        if values[2] == 0:  # the gate was closed: no update applied, no step counted
            self.step = before
        return values
