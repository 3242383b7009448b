"""DataParallelTrainer on the CPU backend: real training, equality with one device and with a
NumPy reference, uneven splits, the original's form, recovery from a poisoned context and a
SIGKILLed worker mid-step, typed errors; TorchModule where torch is installed."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    CollectiveAborted,
    ContextPoisoned,
    DTypeMismatch,
    FaultKind,
    FunctionFailed,
    GpuRefStale,
    InvalidArgument,
    LibraryUnavailable,
    System,
    UserCodeError,
)
from atomr_accel.facade import Device
from atomr_accel.train import (
    SGD,
    Adam,
    CrossEntropyLoss,
    DataParallelTrainer,
    Linear,
    MSELoss,
    ReLU,
    ReplicaRecovered,
    Sequential,
    StepResult,
    Tanh,
    TorchModule,
)

Array = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-dp") as s:
        yield s


def devices(system: System, n: int, isolation: str = "thread") -> list[Device]:
    return [system.spawn_device(i, mock=True, isolation=isolation) for i in range(n)]  # type: ignore[arg-type]


def digits() -> tuple[Array, Array, Array, Array]:
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def batches(n: int, size: int, epochs: int, seed: int = 1) -> list[Array]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(epochs):
        order = rng.permutation(n)
        out += [order[i:i + size] for i in range(0, n, size)]
    return out


DIGITS_MODEL = Sequential(Linear(64, 128), ReLU(), Linear(128, 10))


def states_agree(states: list[dict[str, Array]]) -> None:
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        for key, value in states[0].items():
            np.testing.assert_array_equal(other[key], value, err_msg=key)


# ------------------------------------------------------------ an independent reference


def reference_mlp_sgd(params: dict[str, Array], xs: list[Array], ys: list[Array], lr: float,
                      momentum: float) -> tuple[dict[str, Array], list[float]]:
    """Linear-Tanh-Linear, MSE over every element, torch's SGD with momentum, float64."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    bufs: dict[str, Array] = {}
    losses = []
    for x32, y in zip(xs, ys, strict=True):
        x = x32.astype(np.float64)
        a = x @ p["0.weight"].T + p["0.bias"]
        h = np.tanh(a)
        o = h @ p["2.weight"].T + p["2.bias"]
        losses.append(float(np.mean((o - y) ** 2)))
        d_o = 2.0 * (o - y) / o.size
        dh = d_o @ p["2.weight"]
        da = dh * (1.0 - h * h)
        grads = {"2.weight": d_o.T @ h, "2.bias": d_o.sum(0),
                 "0.weight": da.T @ x, "0.bias": da.sum(0)}
        for k, g in grads.items():
            bufs[k] = g if k not in bufs else momentum * bufs[k] + g
            p[k] = p[k] - lr * bufs[k]
    return p, losses


MLP = Sequential(Linear(6, 16), Tanh(), Linear(16, 3))


def random_regression(rows: int, steps: int, seed: int = 3) -> tuple[list[Array], list[Array]]:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((rows, 6)).astype(np.float32) for _ in range(steps)]
    ys = [rng.standard_normal((rows, 3)).astype(np.float32) for _ in range(steps)]
    return xs, ys


# ------------------------------------------------------------------------ the tests


EPOCHS = 15
KILL_EPOCHS = 3
early: list[dict[str, Array]] = []
"""The digits run's state after ``KILL_EPOCHS`` epochs (the kill test's reference)."""


@pytest.fixture(scope="module")
def digits_run(system: System) -> tuple[DataParallelTrainer, list[StepResult], float]:
    """The digits MLP trained on 2 CPU devices (thread host): the trainer, its step
    results and the wall time of the training."""
    x, y, _, _ = digits()
    trainer = DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=CrossEntropyLoss(),
                                        optimizer=Adam(lr=3e-3), devices=devices(system, 2))
    trainer.ready()
    started = time.perf_counter()
    results = []
    order = batches(len(x), 64, EPOCHS)
    for index, rows in enumerate(order):
        results.append(trainer.step(x[rows], y[rows]))
        if index + 1 == len(order) * KILL_EPOCHS // EPOCHS:
            early.append(trainer.state_dict())
    return trainer, results, time.perf_counter() - started


def test_digits_mlp_on_two_cpu_devices_reaches_97_percent(
        digits_run: tuple[DataParallelTrainer, list[StepResult], float]) -> None:
    x, _, x_test, y_test = digits()
    trainer, results, seconds = digits_run
    metrics = trainer.evaluate(x_test, y_test)
    print(f"\n  digits MLP, 2 CPU devices, {EPOCHS} epochs of batch 64: {seconds:.2f} s, "
          f"test accuracy {metrics['accuracy']:.4f}")
    assert all(isinstance(r, StepResult) for r in results)
    assert np.mean(results[-20:]) < np.mean(results[:20])
    assert metrics["accuracy"] >= 0.97
    assert metrics["samples"] == len(x_test)
    predicted = trainer.predict(x_test).argmax(axis=1)
    assert np.mean(predicted == y_test) == metrics["accuracy"]
    states_agree(trainer.replica_states())
    stats = trainer.stats()
    assert stats.steps == len(results) and stats.recoveries == 0
    assert stats.samples == EPOCHS * len(x) and stats.bucket_count == 2


def test_two_devices_equal_one_device_and_a_numpy_reference(system: System) -> None:
    xs, ys = random_regression(32, 5)
    optimizer = SGD(lr=0.1, momentum=0.9)
    one = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=optimizer,
                                    devices=devices(system, 1), seed=7)
    two = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=optimizer,
                                    devices=devices(system, 2), seed=7)
    losses_one = [float(one.step(x, y)) for x, y in zip(xs, ys, strict=True)]
    losses_two = [float(two.step(x, y)) for x, y in zip(xs, ys, strict=True)]
    expected, reference_losses = reference_mlp_sgd(MLP.init_parameters(7), xs, ys, 0.1, 0.9)
    np.testing.assert_allclose(losses_two, losses_one, rtol=1e-5)
    np.testing.assert_allclose(losses_two, reference_losses, rtol=1e-4)
    state_one, state_two = one.state_dict(), two.state_dict()
    for name, value in expected.items():
        np.testing.assert_allclose(state_two[name], state_one[name], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(state_two[name], value, rtol=1e-4, atol=1e-5)
    states_agree(two.replica_states())


def test_uneven_splits_weight_each_replica_by_its_rows(system: System) -> None:
    xs, ys = random_regression(7, 3, seed=5)  # 3 + 2 + 2 rows on three replicas
    xs.append(xs[0][:2])  # then 2 rows on three replicas: one share is empty
    ys.append(ys[0][:2])
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=SGD(lr=0.05),
                                        devices=devices(system, 3), seed=2)
    losses = [float(trainer.step(x, y)) for x, y in zip(xs, ys, strict=True)]
    expected, reference_losses = reference_mlp_sgd(MLP.init_parameters(2), xs, ys, 0.05, 0.0)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)
    state = trainer.state_dict()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-5)
    states_agree(trainer.replica_states())


def test_micro_batches_accumulate_to_the_whole_batch_gradient(system: System) -> None:
    xs, ys = random_regression(11, 3, seed=8)
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=SGD(lr=0.05),
                                        devices=devices(system, 2), seed=4, micro_batch=2)
    losses = [float(trainer.step(x, y)) for x, y in zip(xs, ys, strict=True)]
    expected, reference_losses = reference_mlp_sgd(MLP.init_parameters(4), xs, ys, 0.05, 0.0)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-4)
    state = trainer.state_dict()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-5)


def test_the_original_form_trains_its_default_model(system: System) -> None:
    trainer = DataParallelTrainer.spawn(system, 2, 1, 0.05)
    batch = [[1.0, 2.0], [3.0, 4.0], [0.5, -1.0], [2.0, 0.0]]
    rows = np.asarray(batch)
    params = Sequential(Linear(2, 1)).init_parameters(0)
    w, b = params["0.weight"].astype(np.float64), params["0.bias"].astype(np.float64)
    residual = rows @ w.T + b - rows.sum(axis=1, keepdims=True)
    g_w, g_b = 2 * residual.T @ rows / 4, 2 * residual.sum(0) / 4
    loss, grad_norm, micros = trainer.step(batch)
    assert loss == pytest.approx(float(np.mean(residual ** 2)), rel=1e-5)
    assert grad_norm == pytest.approx(float(np.sqrt((g_w ** 2).sum() + (g_b ** 2).sum())),
                                      rel=1e-5)
    assert isinstance(micros, int) and micros > 0
    for _ in range(300):
        result = trainer.step(batch, 10.0)
    assert float(result) < 1e-3 < loss
    state = trainer.state_dict()
    np.testing.assert_allclose(state["0.weight"], [[1.0, 1.0]], atol=0.05)
    assert trainer.predict([[10.0, 20.0]])[0, 0] == pytest.approx(30.0, abs=1.0)
    with pytest.raises(InvalidArgument):
        trainer.step([[1.0, 2.0, 3.0]])  # the model is two features wide now


def test_a_poisoned_context_mid_step_is_recovered_exactly(system: System) -> None:
    x, y, x_test, y_test = digits()
    order = batches(len(x), 128, 2)
    reference = DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=CrossEntropyLoss(),
                                          optimizer=Adam(lr=3e-3), devices=devices(system, 2))
    for rows in order:
        reference.step(x[rows], y[rows])
    devs = devices(system, 2)
    trainer = DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=CrossEntropyLoss(),
                                        optimizer=Adam(lr=3e-3), devices=devs)
    events: list[ReplicaRecovered] = []
    system.actors.event_stream.subscribe(events.append, ReplicaRecovered)

    async def poisoned_step(rows: Array) -> StepResult:
        step = asyncio.ensure_future(trainer.step_async(x[rows], y[rows]))
        with pytest.raises(ContextPoisoned):
            await devs[1].inject_fault_async(FaultKind.POISON)
        return await step

    for index, rows in enumerate(order):
        if index in (5, 15):
            result = system._portal.call(poisoned_step(rows))
            assert float(result) > 0
        elif index == 10:  # between two steps
            with pytest.raises(ContextPoisoned):
                devs[0].inject_fault(FaultKind.POISON)
            trainer.step(x[rows], y[rows])
        else:
            trainer.step(x[rows], y[rows])
    stats = trainer.stats()
    assert stats.recoveries >= 3 and stats.steps == len(order)
    assert devs[1].generation >= 3 and devs[0].generation >= 2
    states = trainer.replica_states()
    states_agree(states)
    expected = reference.state_dict()
    for key, value in expected.items():
        np.testing.assert_allclose(states[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    assert trainer.evaluate(x_test, y_test)["accuracy"] == \
        reference.evaluate(x_test, y_test)["accuracy"]
    mine = [e for e in events if e.trainer == trainer.path]
    assert len(mine) == stats.recoveries
    assert {e.replica for e in mine} == {0, 1}
    assert all(e.source in ("replica 0", "replica 1") and e.seconds >= 0 for e in mine)
    assert all(e.reason.split(":")[0] in ("ContextPoisoned", "CollectiveAborted",
                                          "GpuRefStale") for e in mine), mine


def test_without_retries_a_broken_step_raises_typed_and_the_next_one_heals(
        system: System) -> None:
    xs, ys = random_regression(16, 4, seed=17)
    devs = devices(system, 2)
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=SGD(lr=0.05),
                                        devices=devs, max_retries=0, seed=3)
    reference = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=SGD(lr=0.05),
                                          devices=devices(system, 2), seed=3)
    trainer.step(xs[0], ys[0])
    with pytest.raises((ContextPoisoned, CollectiveAborted, GpuRefStale)):
        # no retry: the step fails with a typed error and no replica applied it
        system._portal.call(_poisoned(trainer, devs[1], xs[1], ys[1]))
    assert trainer.stats().steps == 1
    for x, y in zip(xs[1:], ys[1:], strict=True):  # the first heals replica 1
        trainer.step(x, y)
    assert trainer.stats().recoveries == 1
    for x, y in zip(xs, ys, strict=True):
        reference.step(x, y)
    states = trainer.replica_states()
    states_agree(states)
    for key, value in reference.state_dict().items():
        np.testing.assert_allclose(states[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


async def _poisoned(trainer: DataParallelTrainer, device: Device, x: Array, y: Array) -> Any:
    step = asyncio.ensure_future(trainer.step_async(x, y))
    with pytest.raises(ContextPoisoned):
        await device.inject_fault_async(FaultKind.POISON)
    return await step


def test_a_sigkilled_worker_mid_training_is_recovered(
        system: System, digits_run: tuple[DataParallelTrainer, list[StepResult], float],
) -> None:
    x, y, _, _ = digits()
    order = batches(len(x), 64, EPOCHS)[:len(batches(len(x), 64, KILL_EPOCHS))]
    reference = early[0]  # the digits run's state at the same step, undisturbed
    del digits_run
    devs = devices(system, 2, "process")
    trainer = DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=CrossEntropyLoss(),
                                        optimizer=Adam(lr=3e-3), devices=devs)
    kill_at = len(order) // 2
    killed = None
    pid = devs[1].stats().host_pid
    assert pid is not None and pid != os.getpid()

    async def killed_step(rows: Array) -> StepResult:
        step = asyncio.ensure_future(trainer.step_async(x[rows], y[rows]))
        await asyncio.sleep(0.002)  # the step's ops are in flight
        os.kill(pid, signal.SIGKILL)
        return await step

    for index, rows in enumerate(order):
        if index == kill_at:
            killed = system._portal.call(killed_step(rows))
        else:
            trainer.step(x[rows], y[rows])
    assert killed is not None and float(killed) > 0
    print(f"\n  killed step: {killed!r}, recovered {killed.recovered}")
    stats = trainer.stats()
    assert stats.recoveries >= 1 and stats.last_recovery_seconds is not None
    assert devs[1].stats().host_pid not in (None, pid)
    states = trainer.replica_states()
    states_agree(states)
    for key, value in reference.items():  # so the same accuracy too
        np.testing.assert_allclose(states[0][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_one_replica_recovers_from_its_checkpoint_and_replays(system: System) -> None:
    xs, ys = random_regression(16, 9, seed=11)
    dev = devices(system, 1)[0]
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(),
                                        optimizer=SGD(lr=0.05, momentum=0.5), devices=[dev],
                                        checkpoint_every=4, seed=1)
    for index, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if index == 6:  # two steps after the checkpoint of step 4
            with pytest.raises(ContextPoisoned):
                dev.inject_fault(FaultKind.POISON)
        trainer.step(x, y)
    stats = trainer.stats()
    assert stats.recoveries == 1 and stats.replayed_steps == 2 and stats.checkpoint_step == 8
    expected, _ = reference_mlp_sgd(MLP.init_parameters(1), xs, ys, 0.05, 0.5)
    state = trainer.state_dict()
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-4, atol=1e-5)
    assert int(state["optimizer.step"]) == len(xs)


def test_save_and_load_round_trip(system: System, tmp_path: Path) -> None:
    xs, ys = random_regression(8, 4, seed=13)
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=Adam(lr=0.01),
                                        devices=devices(system, 2))
    trainer.step(xs[0], ys[0])
    path = tmp_path / "state.npz"
    trainer.save(path)
    before = trainer.predict(xs[1])
    after_one = float(trainer.step(xs[1], ys[1]))
    trainer.load(path)
    np.testing.assert_array_equal(trainer.predict(xs[1]), before)
    assert float(trainer.step(xs[1], ys[1])) == pytest.approx(after_one, rel=1e-6)
    states_agree(trainer.replica_states())


def test_typed_errors_leave_the_trainer_serving(system: System, tmp_path: Path) -> None:
    loss, opt = CrossEntropyLoss(), Adam()
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, "mlp", loss=loss, optimizer=opt)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, DIGITS_MODEL, loss="ce", optimizer=opt)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=loss, optimizer=None)  # type: ignore[call-overload]
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=loss, optimizer=opt, n_replicas=0)
    dev = devices(system, 1)[0]
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=loss, optimizer=opt,
                                  devices=[dev, dev])
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(system, 2, 4, -0.1)
    with pytest.raises(InvalidArgument):
        DataParallelTrainer.spawn(object(), 2)  # type: ignore[call-overload]
    trainer = DataParallelTrainer.spawn(system, DIGITS_MODEL, loss=loss, optimizer=opt,
                                        devices=devices(system, 2))
    rng = np.random.default_rng(0)
    x = rng.random((8, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 8)
    with pytest.raises(InvalidArgument):
        trainer.step(x[:, :10], labels)  # the model takes 64 features
    with pytest.raises(InvalidArgument):
        trainer.step(x, labels[:5])
    with pytest.raises(DTypeMismatch):
        trainer.step(x, labels.astype(np.float32))
    with pytest.raises(InvalidArgument):
        trainer.step(np.full((8, 64), np.nan), labels)
    with pytest.raises(InvalidArgument):
        trainer.step(x)  # the own form needs targets
    with pytest.raises(InvalidArgument):
        trainer.step(x, labels, timeout_secs=-1)
    with pytest.raises(InvalidArgument):
        trainer.load(tmp_path / "missing.npz")
    with pytest.raises(InvalidArgument):
        trainer.load_state_dict({"0.weight": np.zeros((128, 64))})
    with pytest.raises(InvalidArgument):
        trainer.step(x, np.full(8, 10))  # a label out of range, found on the device
    assert float(trainer.step(x, labels)) > 0  # still serving, replicas in step
    states_agree(trainer.replica_states())
    with pytest.raises(TypeError):
        DataParallelTrainer()  # type: ignore[call-arg]  # no __new__ form: use spawn
    original = DataParallelTrainer.spawn(system, 2)
    with pytest.raises(InvalidArgument):
        original.predict([[1.0, 2.0]])  # no width before the first batch
    with pytest.raises(InvalidArgument):
        original.step([["a", "b"]])


@pytest.mark.parametrize(("where", "value"), [("x", np.nan), ("x", np.inf), ("y", np.nan),
                                             ("y", -np.inf)])
def test_a_nan_or_infinity_anywhere_in_a_batch_applies_nothing(
        system: System, where: str, value: float) -> None:
    """One bad value in one replica's share: found on the devices (the loss or the summed
    gradient), a typed error, every replica's parameters and momentum as before, and the
    next step trains. A NaN input the first ReLU would drop still reaches the gradient."""
    model = Sequential(Linear(16, 32), ReLU(), Linear(32, 4))
    trainer = DataParallelTrainer.spawn(system, model, loss=MSELoss(),
                                        optimizer=SGD(lr=0.05, momentum=0.9),
                                        devices=devices(system, 2))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((10, 16)).astype(np.float32)
    y = rng.standard_normal((10, 4)).astype(np.float32)
    trainer.step(x, y)
    before = trainer.replica_states()
    bad_x, bad_y = x.copy(), y.copy()
    (bad_x if where == "x" else bad_y)[7, 3] = value  # row 7: the second replica's share
    with pytest.raises(InvalidArgument, match="not finite"):
        trainer.step(bad_x, bad_y)
    after = trainer.replica_states()
    for old, new in zip(before, after, strict=True):
        assert old.keys() == new.keys()
        for key in old:
            np.testing.assert_array_equal(new[key], old[key], err_msg=key)
    assert np.isfinite(float(trainer.step(x, y)))
    states_agree(trainer.replica_states())
    trainer.stop()


def test_the_original_form_refuses_a_row_whose_sum_is_not_finite(system: System) -> None:
    trainer = DataParallelTrainer.spawn(system, 2)
    batch = [[1.0, 2.0], [3.0, 4.0]]
    trainer.step(batch)
    before = trainer.replica_states()
    with pytest.raises(InvalidArgument, match="not finite"):
        trainer.step([[np.inf, -np.inf], [3.0, 4.0]])  # its target, the row's sum, is NaN
    for old, new in zip(before, trainer.replica_states(), strict=True):
        for key in old:
            np.testing.assert_array_equal(new[key], old[key], err_msg=key)
    assert np.isfinite(float(trainer.step(batch)))
    trainer.stop()


def test_torch_module_trains_like_plain_torch_on_the_cpu(system: System) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    xs, ys = random_regression(10, 4, seed=21)
    reference = TorchModule(net).copy_module()
    optim = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    expected = []
    for x, y in zip(xs, ys, strict=True):
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(reference(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optim.step()
        expected.append(loss.item())
    trainer = DataParallelTrainer.spawn(system, TorchModule(net, bucket_bytes=256),
                                        loss=MSELoss(), optimizer=SGD(lr=0.1, momentum=0.9),
                                        devices=devices(system, 3))
    got = [float(trainer.step(x, y)) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert trainer.stats().bucket_count > 1
    state = trainer.state_dict()
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(state[name], value.numpy(), rtol=1e-5, atol=1e-6)
    states_agree(trainer.replica_states())


def test_torch_module_replicas_recover_their_adam_state(system: System) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    xs, ys = random_regression(12, 6, seed=23)
    reference = TorchModule(net).copy_module()
    optim = torch.optim.Adam(reference.parameters(), lr=0.01, foreach=False)
    for x, y in zip(xs, ys, strict=True):
        optim.zero_grad()
        torch.nn.functional.mse_loss(reference(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        optim.step()
    devs = devices(system, 2)
    trainer = DataParallelTrainer.spawn(system, TorchModule(net, bucket_bytes=256),
                                        loss=MSELoss(), optimizer=Adam(lr=0.01), devices=devs)
    for index, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if index == 2:
            system._portal.call(_poisoned(trainer, devs[1], x, y))
        else:
            if index == 4:
                with pytest.raises(ContextPoisoned):
                    devs[0].inject_fault(FaultKind.POISON)
            trainer.step(x, y)
    assert trainer.stats().recoveries >= 2
    states = trainer.replica_states()
    states_agree(states)
    assert int(states[0]["step"]) == len(xs)
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(states[0][name], value.numpy(), rtol=1e-5, atol=1e-6)


def test_torch_module_without_torch_names_the_package() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(LibraryUnavailable, match="torch"):
            TorchModule(object())
    else:
        with pytest.raises(InvalidArgument):
            TorchModule(object())


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt, asyncio.CancelledError,
                                    ValueError])
def test_a_torch_module_that_raises_any_exception_fails_only_its_step(
        system: System, raised: type[BaseException]) -> None:
    """The user's forward runs as user code: a SystemExit, KeyboardInterrupt or stray
    CancelledError fails that step with a typed UserCodeError, any other exception with
    FunctionFailed; the trainer keeps its replicas and trains on."""
    torch = pytest.importorskip("torch")
    failing = threading.Event()  # shared by every replica's copy of the module

    class Flaky(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(6, 3)

        def forward(self, x: Any) -> Any:
            if failing.is_set():
                raise raised("from the user's forward")
            return self.linear(x)

    net = Flaky()
    trainer = DataParallelTrainer.spawn(system, TorchModule(net), loss=MSELoss(),
                                        optimizer=SGD(lr=0.1), devices=devices(system, 2))
    xs, ys = random_regression(3, 4, seed=22)
    first = float(trainer.step(xs[0], ys[0]))
    failing.set()
    expected = FunctionFailed if issubclass(raised, Exception) else UserCodeError
    with pytest.raises(expected) as failed:
        trainer.step(xs[1], ys[1])
    assert isinstance(failed.value.__cause__, raised)
    failing.clear()
    assert np.isfinite(float(trainer.step(xs[2], ys[2]))) and np.isfinite(first)
    trainer.stop()


def test_the_trainer_collects_its_set_up_garbage_before_training_goes_on() -> None:
    """A full collection once the replicas are built and once after the third step, and
    none in the steps between or after: the one the set-up's survivors would trigger later
    is not left to land mid-training."""
    full: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(1)

    rng = np.random.default_rng(12)
    x, y = rng.standard_normal((8, 4)), rng.standard_normal((8, 2))
    was_enabled = gc.isenabled()
    gc.disable()  # only the collections asked for run, and they are counted
    gc.callbacks.append(count)
    try:
        with System.open("gc") as system:
            devices = [system.spawn_device(mock=True) for _ in range(2)]
            trainer = DataParallelTrainer.spawn(system, Sequential(Linear(4, 2)), loss=MSELoss(),
                                                optimizer=SGD(lr=0.1), devices=devices)
            trainer.ready(timeout_secs=60)
            assert len(full) == 1
            counts = []
            for _ in range(5):
                trainer.step(x, y)
                counts.append(len(full))
            assert counts == [1, 1, 2, 2, 2]
    finally:
        gc.callbacks.remove(count)
        if was_enabled:
            gc.enable()
