"""PipelineParallelTrainer on CPU devices against the unsplit model on one device.

The reference is a single ``ModelReplica`` of the whole model taking
``train_step`` on the whole batch: the pipeline must give the same loss every
step and the same parameters and optimizer state after several (float32
round-off: the micro-batches sum their gradients in another order). The
schedules are checked on their own by simulating the stages' dependencies.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    AskTimeout,
    ContextPoisoned,
    DTypeMismatch,
    FaultKind,
    InvalidArgument,
    OutOfMemory,
    System,
)
from atomr_accel.core.ops._faults import InjectFault
from atomr_accel.train import (
    SGD,
    AdamW,
    CrossEntropyLoss,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    PipelineParallelTrainer,
    ReLU,
    Sequential,
    Tanh,
)
from atomr_accel.train._schedule import schedule, simulate


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-pipeline") as opened:
        for _ in range(3):
            opened.spawn_device(mock=True)
        yield opened


@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_schedules_run_every_pass_once_without_deadlock(kind: str, n_stages: int,
                                                        m: int) -> None:
    plan = schedule(kind, n_stages, m)
    order = simulate(plan)
    for stage, passes in enumerate(plan):
        assert sorted(passes) == sorted([("F", i) for i in range(m)] +
                                        [("B", i) for i in range(m)])
        live = peak = 0
        for step, _ in passes:
            live += 1 if step == "F" else -1
            peak = max(peak, live)
        assert peak == (min(n_stages - stage, m) if kind == "1f1b" else m)
    assert len(order) == 2 * n_stages * m


LAYERS = [Linear(6, 10), Tanh(), Linear(10, 8), ReLU(), LayerNorm(8), Linear(8, 4)]
CUTS = {2: [2, 6], 3: [2, 5, 6]}


def stages(n: int) -> list[Sequential]:
    bounds = [0, *CUTS[n]]
    return [Sequential(*LAYERS[a:b]) for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize(("n_stages", "kind", "m", "classes"), [
    (2, "1f1b", 1, True), (2, "1f1b", 3, False), (2, "gpipe", 4, True),
    (3, "1f1b", 4, True), (3, "gpipe", 3, False), (3, "gpipe", 1, False),
])
def test_same_as_the_unsplit_model(system: System, n_stages: int, kind: str, m: int,
                                   classes: bool) -> None:
    rng = np.random.default_rng(n_stages * 10 + m)
    x = rng.standard_normal((14, 6)).astype(np.float32)  # 14 rows: uneven micro-batches
    y = rng.integers(0, 4, 14) if classes else rng.standard_normal((14, 4)).astype(np.float32)
    loss = CrossEntropyLoss(label_smoothing=0.1) if classes else MSELoss()
    optimizer = AdamW(lr=0.01) if classes else SGD(0.05, momentum=0.9)
    devices = system.devices[:n_stages]
    trainer = PipelineParallelTrainer.spawn(system, stages(n_stages), devices, loss=loss,
                                            optimizer=optimizer, micro_batches=m,
                                            schedule=kind, seed=3)
    reference = ModelReplica.create(system.devices[0], Sequential(*LAYERS), loss=loss,
                                    optimizer=optimizer, seed=3)
    for _ in range(3):
        got = trainer.step(x, y)
        want = reference.train_step(x, y)
        assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6)
        loss_value, grad_norm, micros = got  # the original's triple
        assert loss_value == float(got) and micros > 0
        norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum())
                           for g in reference.gradients().values()))
        assert grad_norm == pytest.approx(norm, rel=1e-4)
    state, expected = trainer.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(trainer.predict(x), reference.predict(x), rtol=1e-4, atol=1e-5)
    trainer.stop()


def test_the_originals_form_trains_its_default_model(system: System) -> None:
    trainer = PipelineParallelTrainer.spawn(system, n_stages=2, micro_batch_size=4, lr=0.05)
    assert len(trainer.devices) == 2
    batch = np.random.default_rng(5).uniform(-1, 1, 10).tolist()  # 4 + 4 + 2 rows
    first = trainer.step(batch)
    losses = [float(trainer.step(batch)) for _ in range(60)]
    loss, grad_norm, micros = first
    assert grad_norm > 0 and micros > 0
    assert losses[-1] < 0.25 * loss  # it learns to reproduce its inputs
    out = trainer.predict(batch)
    assert out.shape == (10, 1)
    trainer.stop()


def test_typed_errors(system: System) -> None:
    two = stages(2)
    devices = system.devices[:2]
    kwargs = {"loss": MSELoss(), "optimizer": SGD(0.1)}
    with pytest.raises(InvalidArgument):
        PipelineParallelTrainer.spawn(system, two, devices[:1], **kwargs)
    with pytest.raises(InvalidArgument):
        PipelineParallelTrainer.spawn(system, two, devices, schedule="zigzag", **kwargs)
    with pytest.raises(InvalidArgument):
        PipelineParallelTrainer.spawn(system, two, devices, micro_batches=0, **kwargs)
    with pytest.raises(InvalidArgument):  # stage 2 does not take stage 1's 10 features
        PipelineParallelTrainer.spawn(system, [two[0], Sequential(Linear(9, 2))], devices,
                                      **kwargs)
    with pytest.raises(InvalidArgument):
        PipelineParallelTrainer.spawn(system, n_stages=0)
    trainer = PipelineParallelTrainer.spawn(system, two, devices, micro_batches=4, **kwargs)
    with pytest.raises(InvalidArgument):
        trainer.step(np.ones((3, 6)), np.ones((3, 4)))  # 3 rows, 4 micro-batches
    with pytest.raises(InvalidArgument):
        trainer.step(np.ones((8, 6)), np.ones((7, 4)))
    with pytest.raises(InvalidArgument):
        trainer.step(np.full((8, 6), np.nan), np.ones((8, 4)))
    with pytest.raises(DTypeMismatch):
        trainer.step(np.ones((8, 6)), np.array(["a"] * 8))
    with pytest.raises(InvalidArgument):  # y=None reconstructs x: 4 outputs cannot match 6
        trainer.step(np.ones((8, 6)))
    assert float(trainer.step(np.ones((8, 6)), np.ones((8, 4)))) > 0  # still serving
    trainer.stop()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_lost_stage_is_rebuilt_and_training_goes_on_exactly(isolation: str) -> None:
    """Stage 2's context is poisoned (thread host) or its worker killed (process host)
    after 20 steps, past the checkpoint at 16: the next step rebuilds it, replays steps
    17-20 and redoes the step; every loss and the final state equal an undisturbed run."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((12, 6)).astype(np.float32)
    y = rng.integers(0, 4, 12)
    kwargs = {"loss": CrossEntropyLoss(), "optimizer": AdamW(0.01), "micro_batches": 3,
              "seed": 1}
    with System.open("train-pipeline-recovery") as system:
        first = system.spawn_device(mock=True)
        lost = system.spawn_device(mock=True, isolation=isolation)
        calm = [system.spawn_device(mock=True) for _ in range(2)]
        trainer = PipelineParallelTrainer.spawn(system, stages(2), [first, lost], **kwargs)
        reference = PipelineParallelTrainer.spawn(system, stages(2), calm, **kwargs)
        for k in range(24):
            if k == 20:
                fault = FaultKind.POISON if isolation == "thread" else FaultKind.CRASH
                with pytest.raises(ContextPoisoned):
                    lost.inject_fault(fault)
            got, want = trainer.step(x, y), reference.step(x, y)
            assert got.recovered == (k == 20)
            assert float(got) == float(want)
        state, expected = trainer.state_dict(), reference.state_dict()
        for name, value in expected.items():
            np.testing.assert_array_equal(state[name], value, err_msg=name)


def test_stages_may_share_a_device(system: System) -> None:
    """Three stages on two devices (the first and last share one: a device copy there)."""
    rng = np.random.default_rng(31)
    x = rng.standard_normal((9, 6)).astype(np.float32)
    y = rng.standard_normal((9, 4)).astype(np.float32)
    a, b = system.devices[:2]
    trainer = PipelineParallelTrainer.spawn(system, stages(3), [a, b, a], loss=MSELoss(),
                                            optimizer=SGD(0.1), micro_batches=3)
    reference = ModelReplica.create(a, Sequential(*LAYERS), loss=MSELoss(), optimizer=SGD(0.1))
    for _ in range(2):
        assert float(trainer.step(x, y)) == pytest.approx(reference.train_step(x, y), rel=1e-5)
    trainer.stop()


def test_the_originals_form_in_a_system_without_devices() -> None:
    with System.open("train-pipeline-bare") as bare:
        trainer = PipelineParallelTrainer.spawn(bare, n_stages=3)
        assert len(bare.devices) == 1 and trainer.devices == (bare.devices[0],) * 3
        loss, grad_norm, _ = trainer.step([0.5, -0.5, 0.25, 1.0, -1.0])
        assert loss > 0 and grad_norm > 0


def test_a_step_past_its_time_out_is_a_typed_error_and_training_goes_on(
        system: System) -> None:
    """Stage 2's device is held busy past the step's time-out: the step raises
    ``AskTimeout``; the next step restores the state the timed-out step may have left
    half-made, and every later loss and the final state equal a run without it."""
    rng = np.random.default_rng(37)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.integers(0, 4, 8)
    kwargs = {"loss": CrossEntropyLoss(), "optimizer": AdamW(0.01), "micro_batches": 2}
    a, b, c = system.devices[:3]
    trainer = PipelineParallelTrainer.spawn(system, stages(2), [a, b], **kwargs)
    reference = PipelineParallelTrainer.spawn(system, stages(2), [c, c], **kwargs)
    for _ in range(3):
        assert float(trainer.step(x, y)) == float(reference.step(x, y))
    held: list[BaseException] = []

    def hold() -> None:  # 1.5 s of work on stage 2's device, then an OutOfMemory
        try:
            b.run(InjectFault(FaultKind.OOM, delay=1.5))
        except OutOfMemory as exc:
            held.append(exc)

    busy = threading.Thread(target=hold)
    busy.start()
    time.sleep(0.2)
    with pytest.raises(AskTimeout):
        trainer.step(x, y, timeout_secs=0.5)
    busy.join(10)
    assert len(held) == 1
    for _ in range(3):
        assert float(trainer.step(x, y)) == float(reference.step(x, y))
    state, expected = trainer.state_dict(), reference.state_dict()
    for name, value in expected.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    trainer.stop()
    reference.stop()


def test_a_crashed_trainer_actor_keeps_its_model(system: System,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected error inside the actor (a bug, simulated) restarts it: the new
    incarnation keeps the replicas, recovers from the checkpoint and trains on as a run
    without the crash would."""
    from atomr_accel.train import _pipeline

    rng = np.random.default_rng(41)
    x = rng.standard_normal((8, 6)).astype(np.float32)
    y = rng.integers(0, 4, 8)
    kwargs = {"loss": CrossEntropyLoss(), "optimizer": AdamW(0.01), "micro_batches": 2}
    a, b, c = system.devices[:3]
    trainer = PipelineParallelTrainer.spawn(system, stages(2), [a, b], **kwargs)
    reference = PipelineParallelTrainer.spawn(system, stages(2), [c, c], **kwargs)
    for _ in range(3):
        assert float(trainer.step(x, y)) == float(reference.step(x, y))
    real = _pipeline._PipelineActor._step

    async def broken(self: Any, *args: Any) -> Any:
        await real(self, *args)  # the update happens, then the "bug"
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(_pipeline._PipelineActor, "_step", broken)
    with pytest.raises(RuntimeError, match="simulated bug"):  # the caller sees the bug
        trainer.step(x, y)
    monkeypatch.setattr(_pipeline._PipelineActor, "_step", real)
    for _ in range(3):
        assert float(trainer.step(x, y)) == float(reference.step(x, y))
    state, expected = trainer.state_dict(), reference.state_dict()
    for name, value in expected.items():
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    trainer.stop()
    reference.stop()


def test_no_construction_without_spawn() -> None:
    """As the original's trainers (no ``__new__``): only ``spawn`` makes one."""
    with pytest.raises(TypeError):
        PipelineParallelTrainer()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        PipelineParallelTrainer(object())  # type: ignore[arg-type]
