"""Dropout whose seed comes from a device buffer (``DropoutForward.seeds``).

With ``seeds``, the forward op reads its seed from ``seeds[seed]`` as it runs, so a
training step's dropout ops are the same every step: the step writes the step's seeds
into the buffer, and on CUDA the sequence holding the forward (or the backward) is
recorded as a graph once and replayed. Each run below writes new seeds and new data,
and the masks are held against the documented hash, in plain Python integers. The CUDA
cases run on a GPU (``-m gpu``).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from _splitmix import MASK64, splitmix64

from atomr_accel import DType, System
from atomr_accel.core import GpuRef
from atomr_accel.core.ops._dnn import DropoutBackward, DropoutForward
from atomr_accel.core.ops._graph import OpSequence
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.errors import InvalidArgument
from atomr_accel.facade import Device
from atomr_accel.hosts import BackendSpec
from atomr_accel.train import (
    SGD,
    AdamW,
    DataParallelTrainer,
    Dropout,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    WarmupCosine,
)

BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]  # skipped without a GPU


def documented_mask(seed: int, count: int, p: float) -> np.ndarray[Any, Any]:
    """Element ``i`` is kept when the top 24 bits of ``splitmix64(splitmix64(seed) + i)``
    are at least ``round(p * 2**24)``."""
    key, threshold = splitmix64(seed), round(p * (1 << 24))
    return np.array([splitmix64((key + i) & MASK64) >> 40 >= threshold
                     for i in range(count)], dtype=np.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_reads_each_runs_seed_from_seeds(backend: str) -> None:
    n, p1, p2 = 301, 0.25, 0.6
    engine = BackendSpec(backend).create()
    try:
        def buffer(length: int, kind: DType) -> GpuRef:
            return GpuRef(0, engine.execute(Allocate(kind, length)), kind, length, 0)

        seeds = buffer(3, DType.U64)
        x1, y1, x2, y2, dy, dx = (buffer(n, DType.F64) for _ in range(6))
        m1, m2 = buffer(n, DType.U8), buffer(n, DType.U8)
        sequence = OpSequence((
            DropoutForward(x1, y1, m1, (n,), p1, 0, seeds),
            DropoutForward(x2, y2, m2, (n,), p2, 2, seeds),
            DropoutBackward(dy, m1, dx, (n,), p1),
        ))
        rng = np.random.default_rng(8)
        masks = []
        for run in range(4):
            drawn = [int(s) for s in rng.integers(0, 2**63, 3)]
            data = {ref: rng.standard_normal(n) for ref in (x1, x2, dy)}
            for ref, values in data.items():
                engine.execute(Upload(ref, values))
            engine.execute(Upload(seeds, np.array(drawn, dtype=np.uint64)))
            engine.execute(sequence)
            if backend == "cuda":
                from atomr_accel.backends.cuda._replay import replays_of
                assert replays_of(engine).recorded(sequence) == (run >= 1)
            want1 = documented_mask(drawn[0], n, p1)
            want2 = documented_mask(drawn[2], n, p2)
            np.testing.assert_array_equal(engine.execute(Download(m1)), want1)
            np.testing.assert_array_equal(engine.execute(Download(m2)), want2)
            np.testing.assert_allclose(engine.execute(Download(y1)),
                                       data[x1] * want1 / (1 - p1), rtol=1e-14)
            np.testing.assert_allclose(engine.execute(Download(y2)),
                                       data[x2] * want2 / (1 - p2), rtol=1e-14)
            np.testing.assert_allclose(engine.execute(Download(dx)),
                                       data[dy] * want1 / (1 - p1), rtol=1e-14)
            masks.append(want1)
        assert all((a != b).mean() > 0.2 for a, b in pairwise(masks))
    finally:
        engine.close()


def test_seeds_must_be_a_u64_buffer_holding_the_indexed_seed() -> None:
    x, y = GpuRef(0, 1, DType.F32, 8, 0), GpuRef(0, 2, DType.F32, 8, 0)
    mask = GpuRef(0, 3, DType.U8, 8, 0)
    with pytest.raises(InvalidArgument, match="seeds"):
        DropoutForward(x, y, mask, (8,), 0.5, 0, GpuRef(0, 4, DType.I64, 2, 0)).validate()
    with pytest.raises(InvalidArgument, match="seeds"):
        DropoutForward(x, y, mask, (8,), 0.5, 2, GpuRef(0, 4, DType.U64, 2, 0)).validate()
    DropoutForward(x, y, mask, (8,), 0.5, 1, GpuRef(0, 4, DType.U64, 2, 0)).validate()


def test_a_dropout_models_steps_send_the_same_sequences_with_new_masks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model with Dropout sends the same sequence objects every step (what a CUDA graph
    is recorded for), yet each step draws a new mask: with a learning rate of 0 the
    parameters stay, and the losses of one batch differ from step to step."""
    model = Sequential(Linear(6, 32), LayerNorm(32), ReLU(), Dropout(0.3), Linear(32, 3),
                       Dropout(0.1))
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((16, 6)), rng.standard_normal((16, 3))
    with System.open("dropout-seeds") as system:
        device = system.spawn_device(mock=True)
        replica = ModelReplica.create(device, model, loss=MSELoss(), optimizer=SGD(0.0),
                                      dtype="f64", seed=2)
        before = replica.predict(x)
        sent: list[list[Any]] = []
        run = Device.run_async

        def counted(self: Device, op: Any, *args: Any, **kwargs: Any) -> Any:
            sent[-1].append(op)
            return run(self, op, *args, **kwargs)

        monkeypatch.setattr(Device, "run_async", counted)
        losses = []
        for _ in range(5):
            sent.append([])
            losses.append(replica.train_step(x, y))
        monkeypatch.undo()
        sequences = [[op for op in step if isinstance(op, OpSequence)] for step in sent]
        for later in sequences[2:]:  # (SGD's first step is a step of its own)
            assert len(later) == len(sequences[1])
            assert all(a is b for a, b in zip(later, sequences[1], strict=True))
        drops = [op for seq in sequences[1] for op in seq.ops if isinstance(op, DropoutForward)]
        assert len(drops) == 2 and all(op.seeds is not None for op in drops)
        assert len(set(losses)) == len(losses)
        np.testing.assert_array_equal(replica.predict(x), before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropout_model_trains_alike_on_each_host_and_backend(backend: str) -> None:
    """The same dropout model and batches give the same losses and parameters on a CPU
    device and on ``backend`` (on CUDA: steps replayed as recorded graphs)."""
    model = Sequential(Linear(8, 24), LayerNorm(24), ReLU(), Dropout(0.25), Linear(24, 4))
    opt = AdamW(1e-2, schedule=WarmupCosine(2, 20))
    rng = np.random.default_rng(12)
    batches = [(rng.standard_normal((32, 8)), rng.standard_normal((32, 4))) for _ in range(6)]
    with System.open("dropout-alike") as system:
        reference = ModelReplica.create(system.spawn_device(mock=True), model, loss=MSELoss(),
                                        optimizer=opt, dtype="f64", seed=3)
        other = ModelReplica.create(system.spawn_device(mock=backend == "cpu",
                                                        isolation="thread"),
                                    model, loss=MSELoss(), optimizer=opt, dtype="f64", seed=3)
        for x, y in batches:
            np.testing.assert_allclose(other.train_step(x, y), reference.train_step(x, y),
                                       rtol=1e-10)
        want = reference.state_dict()
        for name, value in other.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_each_micro_batch_of_a_trainer_step_draws_its_own_dropout_masks(p: float) -> None:
    """A trainer step over two micro-batches of the same rows: the first draws the mask a
    step without micro-batches draws, the second a mask of its own, so the step's loss (the
    micro-batches' mean) is not the single batch's. Without Dropout it is, to the bit."""
    model = Sequential(Linear(6, 32), Dropout(p), Linear(32, 3))
    rng = np.random.default_rng(21)
    x, y = rng.standard_normal((8, 6)), rng.standard_normal((8, 3))
    with System.open("micro-masks") as system:
        def step_loss(xs: Any, ys: Any, micro_batch: int | None) -> float:
            trainer = DataParallelTrainer.spawn(
                system, model, loss=MSELoss(), optimizer=SGD(0.0), dtype="f64", seed=3,
                devices=[system.spawn_device(mock=True)], micro_batch=micro_batch)
            try:
                return float(trainer.step(xs, ys))
            finally:
                trainer.stop()

        once = step_loss(x, y, None)
        twice = step_loss(np.concatenate([x, x]), np.concatenate([y, y]), len(x))
    if p == 0.0:
        assert twice == once
    else:
        assert abs(twice - once) > 1e-3 * once
