"""Optimizer updates whose step-dependent scalars come from a device buffer (``hyper``).

An update op with ``hyper`` reads its learning rate and Adam's bias corrections
(``hyper_values``) there as it runs, so the op is the same
every step: a replica's step then sends the same sequences every time, and on CUDA the
sequence holding the updates is recorded as a graph once and replayed. Each run below
writes new values into ``hyper`` and new data into the buffers, and the results are held
against torch's formulas in float64 NumPy. The CUDA case runs on a GPU (``-m gpu``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr_accel import DType, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._train import HYPER_LENGTH, AdamUpdate, SgdUpdate, hyper_values
from atomr_accel.errors import InvalidArgument
from atomr_accel.facade import Device
from atomr_accel.hosts import BackendSpec
from atomr_accel.train import (
    SGD,
    Adam,
    AdamW,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    WarmupCosine,
)

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # skipped without a GPU
Array = np.ndarray[Any, Any]


def _adam(p: Array, g: Array, m: Array, v: Array, lr: float, step: float, wd: float,
          decoupled: bool, scale: float) -> None:
    """torch's Adam / AdamW, in place, float64."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    d = g * scale
    if decoupled:
        p *= 1.0 - lr * wd
    else:
        d = d + wd * p
    m[...] = b1 * m + (1 - b1) * d
    v[...] = b2 * v + (1 - b2) * d * d
    p -= lr / (1 - b1 ** step) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** step) + eps)


def _sgd(p: Array, g: Array, buf: Array, lr: float, first: bool) -> None:
    """torch's SGD with momentum 0.9, Nesterov, weight decay 0.01, in place, float64."""
    d = g + 0.01 * p
    buf[...] = d if first else 0.9 * buf + d
    p -= lr * (d + 0.9 * buf)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=lambda d: d.value)
def test_updates_read_each_runs_lr_and_step_from_hyper(backend: str, dtype: DType) -> None:
    n = 257
    engine = BackendSpec(backend).create()
    try:
        def buffer(length: int, kind: DType = dtype) -> GpuRef:
            return GpuRef(0, engine.execute(Allocate(kind, length)), kind, length, 0)

        hyper = buffer(HYPER_LENGTH, DType.F64)
        p1, g1, m1, v1, p2, g2, m2, v2, p3, g3, b3 = (buffer(n) for _ in range(11))
        sequence = OpSequence((
            AdamUpdate(p1, g1, m1, v1, 0, n, 1e-3, 1, weight_decay=0.01, grad_scale=0.5,
                       hyper=hyper),
            AdamUpdate(p2, g2, m2, v2, 0, n, 1e-3, 1, weight_decay=0.1, decoupled=True,
                       hyper=hyper),
            SgdUpdate(p3, g3, b3, 0, n, 0.1, 0.9, True, 0.01, first_step=False, hyper=hyper),
        ))
        rng = np.random.default_rng(3)
        start = {ref: rng.standard_normal(n) for ref in (p1, m1, p2, m2, p3, b3)}
        start |= {ref: rng.random(n) for ref in (v1, v2)}
        for ref, values in start.items():
            engine.execute(Upload(ref, values.astype(dtype.numpy)))
        want = {ref: values.astype(dtype.numpy).astype(np.float64)
                for ref, values in start.items()}
        tol = 1e-5 if dtype is DType.F32 else 1e-12
        for run, (lr, step) in enumerate([(3e-3, 1), (2e-3, 2), (5e-4, 7), (1e-2, 30)]):
            grads = {ref: rng.standard_normal(n).astype(dtype.numpy) for ref in (g1, g2, g3)}
            for ref, values in grads.items():
                engine.execute(Upload(ref, values))
            engine.execute(Upload(hyper, np.array(hyper_values(lr, step), dtype=np.float64)))
            engine.execute(sequence)
            if backend == "cuda":
                from atomr_accel.backends.cuda._replay import replays_of
                assert replays_of(engine).recorded(sequence) == (run >= 1)
            g = {ref: values.astype(np.float64) for ref, values in grads.items()}
            _adam(want[p1], g[g1], want[m1], want[v1], lr, step, 0.01, False, 0.5)
            _adam(want[p2], g[g2], want[m2], want[v2], lr, step, 0.1, True, 1.0)
            _sgd(want[p3], g[g3], want[b3], lr, False)
            for ref in (p1, m1, v1, p2, m2, v2, p3, b3):
                np.testing.assert_allclose(engine.execute(Download(ref)), want[ref],
                                           rtol=tol, atol=tol)
    finally:
        engine.close()


def test_hyper_must_be_an_f64_buffer_of_its_own_with_room_for_the_values() -> None:
    p, g, m, v = (GpuRef(0, i, DType.F32, 8, 0) for i in range(4))
    with pytest.raises(InvalidArgument, match="hyper"):
        AdamUpdate(p, g, m, v, 0, 8, 1e-3, 1, hyper=GpuRef(0, 9, DType.F32, 3, 0)).validate()
    with pytest.raises(InvalidArgument, match="hyper"):
        SgdUpdate(p, g, None, 0, 8, 0.1, hyper=GpuRef(0, 9, DType.F64, 2, 0)).validate()
    with pytest.raises(InvalidArgument, match="params"):
        SgdUpdate(p, g, None, 0, 8, 0.1, hyper=GpuRef(0, 0, DType.F64, 3, 0)).validate()


@pytest.mark.parametrize("optimizer", [
    Adam(1e-3), AdamW(2e-3, schedule=WarmupCosine(2, 20)), SGD(0.05, momentum=0.9,
                                                                schedule=WarmupCosine(1, 10))],
    ids=["adam", "adamw-scheduled", "sgd-scheduled"])
def test_a_replicas_steps_send_the_same_sequences_each_step(optimizer: Any,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """With a learning rate or bias correction that changes every step, a replica's steps
    still send the same sequence objects (what a CUDA graph is recorded for), and train as
    a replica whose every update carries its own scalars."""
    model = Sequential(Linear(6, 16), ReLU(), Linear(16, 3))
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((8, 6)), rng.standard_normal((8, 3))) for _ in range(5)]
    with System.open("scalars") as system:
        device = system.spawn_device(mock=True)
        replica = ModelReplica.create(device, model, loss=MSELoss(), optimizer=optimizer,
                                      dtype="f64", seed=2)
        sent: list[list[Any]] = []
        run = Device.run_async

        def counted(self: Device, op: Any, *args: Any, **kwargs: Any) -> Any:
            sent[-1].append(op)
            return run(self, op, *args, **kwargs)

        monkeypatch.setattr(Device, "run_async", counted)
        losses = []
        for x, y in batches:
            sent.append([])
            losses.append(replica.train_step(x, y))
        monkeypatch.undo()
        sequences = [[op for op in step if isinstance(op, OpSequence)] for step in sent]
        for later in sequences[2:]:
            assert len(later) == len(sequences[1])
            assert all(a is b for a, b in zip(later, sequences[1], strict=True))
        assert any(isinstance(op, AdamUpdate | SgdUpdate) and op.hyper is not None
                   for seq in sequences[1] for op in seq.ops)

        # the same training with the scalars in each update op (no hyper buffer)
        twin = ModelReplica.create(device, model, loss=MSELoss(), optimizer=optimizer,
                                   dtype="f64", seed=2)
        monkeypatch.setattr(type(twin), "_scalars_vary", lambda self: False)
        twin_losses = [twin.train_step(x, y) for x, y in batches]
        np.testing.assert_allclose(losses, twin_losses, rtol=1e-12)
        np.testing.assert_allclose(replica.predict(batches[0][0]),
                                   twin.predict(batches[0][0]), rtol=1e-12, atol=1e-12)
