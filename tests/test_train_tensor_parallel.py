"""TensorParallelTrainer on CPU devices against the unsplit model on one device.

The reference is one ``ModelReplica`` of the whole model: every step's loss,
and the parameters and optimizer state after several steps, must match (float32
round-off: the row-parallel sums are added in another order). The split itself
is checked on its own: segments found, shards cut and merged back.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, InvalidArgument, System
from atomr_accel.train import (
    GELU,
    SGD,
    Adam,
    AdamW,
    CrossEntropyLoss,
    Dropout,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    Tanh,
    TensorParallelTrainer,
)
from atomr_accel.train._tp_split import (
    Segment,
    merge_parameters,
    segments,
    shard_model,
    shard_parameters,
)

MODEL = Sequential(Linear(6, 10), GELU(), Linear(10, 8), LayerNorm(8), Linear(8, 7), ReLU(),
                   Tanh(), Linear(7, 5), Linear(5, 4))


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-tensor-parallel") as opened:
        for _ in range(3):
            opened.spawn_device(mock=True)
        yield opened


def test_segments_pair_linears_around_elementwise_layers() -> None:
    assert segments(MODEL) == [Segment(0, 3, True), Segment(3, 4, False),
                               Segment(4, 8, True), Segment(8, 9, False)]
    lone = Sequential(Linear(3, 4), LayerNorm(4), Linear(4, 2), Dropout(0.1))
    assert segments(lone) == [Segment(0, 4, False)]


@pytest.mark.parametrize("n", [2, 3])
def test_shards_cut_and_merge_back(n: int) -> None:
    full = MODEL.init_parameters(5)
    for part in segments(MODEL):
        shards = [shard_parameters(MODEL, part, rank, n, full) for rank in range(n)]
        for rank, shard in enumerate(shards):
            assert shard.keys() == shard_model(MODEL, part, rank, n).parameter_shapes().keys()
            for name, value in shard.items():
                assert value.shape == shard_model(MODEL, part, rank, n).parameter_shapes()[name]
        merged = merge_parameters(MODEL, part, shards)
        want = MODEL[part.start:part.stop].parameter_shapes()
        assert merged.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(merged[name], full[name])


@pytest.mark.parametrize(("n", "classes"), [(2, True), (2, False), (3, True)])
def test_same_as_the_unsplit_model(system: System, n: int, classes: bool) -> None:
    rng = np.random.default_rng(n)
    x = rng.standard_normal((12, 6)).astype(np.float32)
    model = MODEL if classes else MODEL[:8]  # MSE on the 5 outputs of layer 7
    y = rng.integers(0, 4, 12) if classes else rng.standard_normal((12, 5)).astype(np.float32)
    loss = CrossEntropyLoss(label_smoothing=0.05) if classes else MSELoss()
    optimizer = AdamW(lr=0.01) if classes else SGD(0.05, momentum=0.9, nesterov=True)
    trainer = TensorParallelTrainer.spawn(system, model, system.devices[:n], loss=loss,
                                          optimizer=optimizer, seed=4)
    reference = ModelReplica.create(system.devices[0], Sequential(*model.layers), loss=loss,
                                    optimizer=optimizer, seed=4)
    for _ in range(3):
        got = trainer.step(x, y)
        assert float(got) == pytest.approx(reference.train_step(x, y), rel=1e-5, abs=1e-6)
        assert got.grad_norm > 0
    state, expected = trainer.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(trainer.predict(x), reference.predict(x), rtol=1e-4, atol=1e-5)
    trainer.stop()


def test_forward_backward_match_the_unsplit_model(system: System) -> None:
    rng = np.random.default_rng(9)
    model = Sequential(Linear(4, 6), ReLU(), Linear(6, 3))
    x = rng.standard_normal((5, 4)).astype(np.float32)
    y = rng.standard_normal((5, 3)).astype(np.float32)
    grad = rng.standard_normal((5, 3)).astype(np.float32)
    trainer = TensorParallelTrainer.spawn(system, model, system.devices[:2], loss=MSELoss(),
                                          optimizer=Adam(0.01))
    reference = ModelReplica.create(system.devices[0], model, loss=MSELoss(),
                                    optimizer=Adam(0.01))
    out, loss = trainer.forward(x, y)
    want = reference.forward(x)
    np.testing.assert_allclose(out, reference.device.copy_to_numpy(want, 0, 15, shape=(5, 3)),
                               rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(reference.compute_loss(y), rel=1e-5)
    norm = trainer.backward(grad)  # an explicit output gradient
    reference.zero_grad()
    reference.backward(grad)
    gradients = reference.gradients()
    assert norm == pytest.approx(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum())
                                             for g in gradients.values())), rel=1e-5)
    reference.optimizer_step()
    state, expected = trainer.state_dict(), reference.state_dict()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    trainer.stop()


def test_the_originals_form_trains_its_default_model(system: System) -> None:
    trainer = TensorParallelTrainer.spawn(system, n_shards=2, lr=0.05)
    sample = [0.5, -0.25, 0.75, 0.1]
    out, first = trainer.forward(sample)
    assert isinstance(out, list) and len(out) == 4 and first >= 0
    assert trainer.backward(1.0) > 0
    for _ in range(40):
        _, loss = trainer.forward(sample)
        trainer.backward(1.0)
    assert loss < 0.5 * first  # it learns to reproduce its input
    batch, _ = trainer.forward([sample, sample])
    assert isinstance(batch, list) and len(batch) == 2
    state = trainer.state_dict()
    assert state["0.weight"].shape == (16, 4) and state["2.weight"].shape == (4, 16)
    trainer.stop()


def test_typed_errors(system: System) -> None:
    devices = system.devices[:2]
    kwargs = {"loss": MSELoss(), "optimizer": SGD(0.1)}
    with pytest.raises(InvalidArgument):
        TensorParallelTrainer.spawn(system, MODEL, [devices[0], devices[0]], **kwargs)
    with pytest.raises(InvalidArgument):
        TensorParallelTrainer.spawn(system, MODEL, [], **kwargs)
    with pytest.raises(InvalidArgument):  # 1 output cannot be split over 2 devices
        TensorParallelTrainer.spawn(system, Sequential(Linear(3, 1), Linear(1, 2)), devices,
                                    **kwargs)
    with pytest.raises(InvalidArgument):
        TensorParallelTrainer.spawn(system, MODEL, devices, loss="mse",
                                    optimizer=SGD(0.1))
    with pytest.raises(InvalidArgument):
        TensorParallelTrainer.spawn(system, n_shards=0)
    trainer = TensorParallelTrainer.spawn(system, Sequential(Linear(4, 6), ReLU(),
                                                             Linear(6, 2)), devices, **kwargs)
    with pytest.raises(InvalidArgument):
        trainer.step(np.ones((3, 5)), np.ones((3, 2)))  # 5 features, the model takes 4
    with pytest.raises(InvalidArgument):
        trainer.step(np.ones((3, 4)))  # y=None reconstructs x: 2 outputs, 4 inputs
    with pytest.raises(InvalidArgument):
        trainer.backward(float("nan"))
    with pytest.raises(InvalidArgument):
        trainer.backward()  # no forward yet
    assert float(trainer.step(np.ones((3, 4)), np.ones((3, 2)))) > 0  # still serving
    trainer.stop()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_lost_rank_is_rebuilt_and_training_goes_on_exactly(isolation: str) -> None:
    """Rank 1's context is poisoned (thread host) or its worker killed (process host) after
    20 steps: the next step rebuilds its shards, reloads the checkpoint of step 16 on both
    ranks, replays 17-20 and redoes the step; all equal an undisturbed run."""
    rng = np.random.default_rng(23)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    y = rng.integers(0, 4, 10)
    kwargs = {"loss": CrossEntropyLoss(), "optimizer": AdamW(0.01), "seed": 6}
    with System.open("train-tp-recovery") as system:
        first = system.spawn_device(mock=True)
        lost = system.spawn_device(mock=True, isolation=isolation)
        calm = [system.spawn_device(mock=True) for _ in range(2)]
        trainer = TensorParallelTrainer.spawn(system, MODEL, [first, lost], **kwargs)
        reference = TensorParallelTrainer.spawn(system, MODEL, calm, **kwargs)
        for k in range(23):
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


def test_the_originals_form_in_a_system_without_devices() -> None:
    with System.open("train-tp-bare") as bare:
        trainer = TensorParallelTrainer.spawn(bare, n_shards=2)
        assert len(bare.devices) == 2
        out, loss = trainer.forward([[1.0, 2.0], [3.0, 4.0]])
        assert len(out) == 2 and len(out[0]) == 2 and loss > 0


def test_no_construction_without_spawn() -> None:
    """As the original's trainers (no ``__new__``): only ``spawn`` makes one."""
    with pytest.raises(TypeError):
        TensorParallelTrainer()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        TensorParallelTrainer(object())  # type: ignore[arg-type]
