"""The data-parallel trainer's step in one host round trip a replica (CPU backend).

The step's loss sum, the summed gradient's sum of squares and the flag "both finite"
live in a device buffer; the optimizer updates are gated on that flag on the device;
one download a replica answers the step. Checked here: the parameters of 1, 2 and 3
replicas (thread host; one process-host case) against a NumPy float64 reference of
SGD with momentum and Adam; a NaN or an infinity in a batch changes nothing, step
count included (the next good step equals a run that never saw the bad batch); the
``GradCheck`` op and the gated updates against NumPy; one download a replica a step;
each run of a replica's ops (between uploads and buckets) as one ``OpSequence``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.core import DType
from atomr_accel.core.ops._graph import OpSequence, may_sequence
from atomr_accel.core.ops._train import AdamUpdate, GradCheck, SgdUpdate
from atomr_accel.facade import Device
from atomr_accel.train import (
    SGD,
    Adam,
    DataParallelTrainer,
    Linear,
    ModelReplica,
    MSELoss,
    Sequential,
    Tanh,
    WarmupCosine,
)

Array = np.ndarray[Any, Any]
Optimizer = SGD | Adam
MLP = Sequential(Linear(6, 16), Tanh(), Linear(16, 3))
RTOL, ATOL = 1e-9, 1e-12
"""float64 on the device against float64 in NumPy: only the summation order differs."""


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-fused-step") as s:
        yield s


def devices(system: System, n: int, isolation: str = "thread") -> list[Device]:
    return [system.spawn_device(i, mock=True, isolation=isolation)  # type: ignore[arg-type]
            for i in range(n)]


def batches(rows: int, steps: int, seed: int) -> list[tuple[Array, Array]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 6)), rng.standard_normal((rows, 3)))
            for _ in range(steps)]


# ------------------------------------------------------------------ the NumPy reference


def warmup_cosine(base: float, step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * base * (1.0 + math.cos(math.pi * progress))


def mlp_gradient(p: dict[str, Array], x: Array, y: Array) -> tuple[float, dict[str, Array]]:
    """Linear-Tanh-Linear, MSE over every element of the whole batch: loss, gradients."""
    h = np.tanh(x @ p["0.weight"].T + p["0.bias"])
    o = h @ p["2.weight"].T + p["2.bias"]
    d_o = 2.0 * (o - y) / o.size
    da = (d_o @ p["2.weight"]) * (1.0 - h * h)
    return float(np.mean((o - y) ** 2)), {"0.weight": da.T @ x, "0.bias": da.sum(0),
                                           "2.weight": d_o.T @ h, "2.bias": d_o.sum(0)}


def reference(seed: int, optimizer: Optimizer, data: list[tuple[Array, Array]],
              ) -> tuple[dict[str, Array], list[float], list[float]]:
    """The state dict (parameters, optimizer state, step), losses and gradient norms of
    torch's SGD (dampening 0, first step ``buf = g``) or Adam, float64."""
    p = {k: v.astype(np.float64) for k, v in MLP.init_parameters(seed, "f64").items()}
    state: dict[str, Array] = {}
    losses, norms = [], []
    for step, (x, y) in enumerate(data):
        loss, grads = mlp_gradient(p, x, y)
        losses.append(loss)
        norms.append(math.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
        for k, g in grads.items():
            if isinstance(optimizer, SGD):
                schedule = optimizer.schedule
                lr = optimizer.lr if schedule is None else warmup_cosine(
                    optimizer.lr, step, schedule.warmup_steps, schedule.total_steps)
                key = f"optimizer.{k}.momentum_buffer"
                buf = g if step == 0 else optimizer.momentum * state[key] + g
                state[key] = buf
                p[k] = p[k] - lr * buf
            else:
                assert isinstance(optimizer, Adam)
                b1, b2 = optimizer.betas
                m_key, v_key = f"optimizer.{k}.exp_avg", f"optimizer.{k}.exp_avg_sq"
                m = b1 * state.get(m_key, 0.0) + (1 - b1) * g
                v = b2 * state.get(v_key, 0.0) + (1 - b2) * g * g
                state[m_key], state[v_key] = m, v
                t = step + 1
                p[k] = p[k] - optimizer.lr / (1 - b1 ** t) * m / (
                    np.sqrt(v) / math.sqrt(1 - b2 ** t) + optimizer.eps)
    return {**p, **state, "optimizer.step": np.array(len(data))}, losses, norms


def assert_states_equal(got: dict[str, Array], want: dict[str, Array]) -> None:
    """Bit for bit, every key."""
    assert got.keys() == want.keys()
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


# ------------------------------------------------------------ (a) against the reference


SGD_MOMENTUM = SGD(lr=0.1, momentum=0.9)
ADAM = Adam(lr=0.01)


@pytest.mark.parametrize(("replicas", "isolation", "optimizer", "micro_batch", "rows"), [
    (1, "thread", SGD_MOMENTUM, None, 8),
    (1, "thread", ADAM, 3, 8),  # three micro-batches back to back, one round trip
    (2, "thread", SGD_MOMENTUM, None, 7),  # uneven shares
    (2, "thread", ADAM, 2, 9),
    (3, "thread", ADAM, None, 2),  # one share is empty
    (2, "process", ADAM, None, 8),
], ids=["1-sgd", "1-adam-micro", "2-sgd-uneven", "2-adam-micro", "3-adam-empty-share",
        "2-adam-process"])
def test_the_trainer_equals_a_float64_numpy_reference(
        system: System, replicas: int, isolation: str, optimizer: Optimizer,
        micro_batch: int | None, rows: int) -> None:
    data = batches(rows, 5, seed=replicas * 10 + rows)
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=optimizer,
                                        devices=devices(system, replicas, isolation), seed=3,
                                        dtype="f64", micro_batch=micro_batch)
    results = [trainer.step(x, y) for x, y in data]
    want, losses, norms = reference(3, optimizer, data)
    np.testing.assert_allclose([float(r) for r in results], losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose([r.grad_norm for r in results], norms, rtol=RTOL, atol=ATOL)
    states = trainer.replica_states()
    for state in states:
        assert state.keys() == want.keys()
        for key, value in want.items():
            np.testing.assert_allclose(state[key], value, rtol=RTOL, atol=ATOL, err_msg=key)
    for state in states[1:]:  # the replicas are identical
        assert_states_equal(state, states[0])
    assert int(states[0]["optimizer.step"]) == len(data)
    trainer.stop()


# ------------------------------------------------ (b) a bad batch changes nothing at all


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("optimizer", [
    Adam(lr=0.01),  # bias correction follows the step count
    SGD(lr=0.1, momentum=0.9, schedule=WarmupCosine(2, 6)),  # so does the learning rate
], ids=["adam", "sgd-schedule"])
@pytest.mark.parametrize(("where", "value"), [("x", np.nan), ("x", np.inf), ("y", np.nan),
                                             ("y", -np.inf)])
def test_a_bad_batch_applies_nothing_and_counts_no_step(
        system: System, replicas: int, optimizer: Optimizer, where: str,
        value: float) -> None:
    """A bad batch first (SGD's first step) and between two good ones: the typed error,
    every replica's whole state as before it, bit for bit; then the run equals, bit for
    bit, one that never saw the bad batches."""
    good = batches(6, 3, seed=21)

    def spawn() -> DataParallelTrainer:
        return DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=optimizer,
                                         devices=devices(system, replicas), seed=4,
                                         dtype="f64")

    def bad(x: Array, y: Array) -> tuple[Array, Array]:
        x, y = x.copy(), y.copy()
        (x if where == "x" else y)[-1, 1] = value  # the last row: the last replica's
        return x, y

    trainer, undisturbed = spawn(), spawn()
    trainer.ready()
    for index, (x, y) in enumerate(good):
        if index in (0, 2):
            before = trainer.replica_states()
            with pytest.raises(InvalidArgument, match="not finite"):
                trainer.step(*bad(x, y))
            for old, new in zip(before, trainer.replica_states(), strict=True):
                assert_states_equal(new, old)
        result = trainer.step(x, y)
        expected = undisturbed.step(x, y)
        assert float(result) == float(expected)
        assert result.grad_norm == expected.grad_norm
    states, want = trainer.replica_states(), undisturbed.replica_states()
    for state, other in zip(states, want, strict=True):
        assert_states_equal(state, other)
    assert int(states[0]["optimizer.step"]) == len(good)
    assert trainer.stats().steps == len(good)
    trainer.stop()
    undisturbed.stop()


# ------------------------------------------------ (c) the op and the gated updates


def run_op(device: Device, arrays: dict[str, Array], make: Any,
           timeout: float = 30.0) -> dict[str, Array]:
    """Upload ``arrays``, run ``make(refs)`` (within ``timeout`` seconds), answer every
    buffer's values."""
    buffers = {}
    for name, value in arrays.items():
        buf = device.allocate(value.size, DType.of(value.dtype))
        device.copy_from_numpy(buf, value.reshape(-1))
        buffers[name] = buf
    device.run(make({k: b.ref for k, b in buffers.items()}), timeout)
    return {k: device.copy_to_numpy(b) for k, b in buffers.items()}


@pytest.fixture(scope="module")
def cpu(system: System) -> Device:
    return system.spawn_device(0, mock=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", ["finite", "nan-grad", "inf-grad", "nan-loss", "inf-loss",
                                  "overflow"])
def test_grad_check_against_numpy(cpu: Device, dtype: Any, case: str) -> None:
    rng = np.random.default_rng(7)
    grads = [rng.standard_normal(n).astype(dtype) for n in (40, 7, 13)]
    stats = np.array([2.5, -9.0, -9.0], dtype)  # junk where GradCheck writes
    if case == "nan-grad":
        grads[1][3] = np.nan
    elif case == "inf-grad":
        grads[2][0] = -np.inf
    elif case == "nan-loss":
        stats[0] = np.nan
    elif case == "inf-loss":
        stats[0] = np.inf
    elif case == "overflow":  # finite values whose sum of squares the dtype cannot hold
        grads[0][:] = np.sqrt(np.finfo(dtype).max)
    arrays = {"g0": grads[0], "g1": grads[1], "g2": grads[2], "stats": stats}
    out = run_op(cpu, arrays, lambda r: GradCheck((r["g0"], r["g1"], r["g2"]), r["stats"]))
    with np.errstate(over="ignore", invalid="ignore"):
        sumsq = sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads)
    got = out["stats"]
    np.testing.assert_array_equal(got[0], stats[0])  # the loss sum is read, not written
    if case in ("nan-grad", "inf-grad", "overflow"):
        assert not np.isfinite(got[1])
    else:
        np.testing.assert_allclose(got[1], sumsq, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert got[2] == (1.0 if case == "finite" else 0.0)
    for name in ("g0", "g1", "g2"):  # the gradients are read, not written
        np.testing.assert_array_equal(out[name], arrays[name])


def test_grad_check_validates_its_buffers(cpu: Device) -> None:
    f32 = cpu.allocate(8, "f32")
    f64 = cpu.allocate(8, "f64")
    short = cpu.allocate(2, "f32")
    stats = cpu.allocate(3, "f32")
    for op, message in [
        (GradCheck((f32.ref,), short.ref), "stats needs 3"),
        (GradCheck((f64.ref,), stats.ref), "dtype"),
        (GradCheck((f32.ref, stats.ref), stats.ref), "must not share"),
        (GradCheck([f32.ref], stats.ref), "tuple of buffers"),  # type: ignore[arg-type]
        (SgdUpdate(f32.ref, f64.ref, None, 0, 8, 0.1), "dtype"),
        (SgdUpdate(f32.ref, stats.ref, None, 0, 3, 0.1, gate=short.ref), "gate needs 3"),
        (AdamUpdate(stats.ref, f32.ref, f32.ref, short.ref, 0, 2, 0.1, 1, gate=stats.ref),
         "must not share"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            cpu.run(op)


def _update_arrays(dtype: Any, flag: float) -> dict[str, Array]:
    rng = np.random.default_rng(11)
    return {"p": rng.standard_normal(30).astype(dtype),
            "g": rng.standard_normal(30).astype(dtype),
            "a": rng.standard_normal(30).astype(dtype),
            "b": rng.uniform(0.1, 1.0, 30).astype(dtype),
            "stats": np.array([1.0, 2.0, flag], dtype)}


UPDATES: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "sgd": lambda r, gate: SgdUpdate(r["p"], r["g"], None, 2, 25, 0.1, weight_decay=0.01,
                                     grad_scale=0.5, gate=gate),
    "sgd-momentum": lambda r, gate: SgdUpdate(r["p"], r["g"], r["a"], 0, 30, 0.1, 0.9,
                                              nesterov=True, gate=gate),
    "sgd-first": lambda r, gate: SgdUpdate(r["p"], r["g"], r["a"], 0, 30, 0.1, 0.9,
                                           first_step=True, gate=gate),
    "adam": lambda r, gate: AdamUpdate(r["p"], r["g"], r["a"], r["b"], 0, 30, 1e-2, 3,
                                       weight_decay=0.01, gate=gate),
    "adamw": lambda r, gate: AdamUpdate(r["p"], r["g"], r["a"], r["b"], 5, 20, 1e-2, 1,
                                        weight_decay=0.01, decoupled=True, gate=gate),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", sorted(UPDATES))
def test_gated_updates_apply_only_with_the_flag(cpu: Device, dtype: Any, kind: str) -> None:
    make = UPDATES[kind]
    ungated = run_op(cpu, _update_arrays(dtype, 1.0), lambda r: make(r, None))
    opened = run_op(cpu, _update_arrays(dtype, 1.0), lambda r: make(r, r["stats"]))
    closed = run_op(cpu, _update_arrays(dtype, 0.0), lambda r: make(r, r["stats"]))
    start = _update_arrays(dtype, 0.0)
    assert not np.array_equal(ungated["p"], start["p"])  # the update did something
    for name in ("p", "g", "a", "b"):
        np.testing.assert_array_equal(opened[name], ungated[name], err_msg=name)
        np.testing.assert_array_equal(closed[name], start[name], err_msg=name)


# ------------------------------------------------------------ one round trip a replica


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_step_downloads_once_a_replica(system: System, replicas: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's only read-back is each replica's stats (3 values); no host-result op."""
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=ADAM,
                                        devices=devices(system, replicas), micro_batch=2)
    x, y = batches(8, 1, seed=5)[0]
    trainer.step(x, y)  # allocations on the first step
    downloads: list[int | None] = []
    host_results: list[str] = []
    copy, run = Device.copy_to_numpy_async, Device.run_async

    def counted_copy(self: Device, buffer: Any, offset: int = 0, length: int | None = None,
                     *args: Any, **kwargs: Any) -> Any:
        downloads.append(length)
        return copy(self, buffer, offset, length, *args, **kwargs)

    def counted_run(self: Device, op: Any, *args: Any, **kwargs: Any) -> Any:
        if type(op).host_result:
            host_results.append(type(op).__name__)
        return run(self, op, *args, **kwargs)

    monkeypatch.setattr(Device, "copy_to_numpy_async", counted_copy)
    monkeypatch.setattr(Device, "run_async", counted_run)
    trainer.step(x, y)
    monkeypatch.undo()
    assert downloads == [3] * replicas
    assert host_results == []
    trainer.stop()


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_step_sends_each_run_of_a_replicas_ops_as_one_request(
        system: System, replicas: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between two uploads or two buckets, a replica's ops go as one ``OpSequence``: no
    op that may go in a sequence goes alone, and the step's requests are few."""
    trainer = DataParallelTrainer.spawn(system, MLP, loss=MSELoss(), optimizer=ADAM,
                                        devices=devices(system, replicas))
    x, y = batches(8, 1, seed=6)[0]
    trainer.step(x, y)  # allocations on the first step
    requests: list[Any] = []
    run = Device.run_async

    def counted_run(self: Device, op: Any, *args: Any, **kwargs: Any) -> Any:
        requests.append(op)
        return run(self, op, *args, **kwargs)

    monkeypatch.setattr(Device, "run_async", counted_run)
    loss = trainer.step(x, y).loss
    monkeypatch.undo()
    sequences = [op for op in requests if isinstance(op, OpSequence)]
    alone = [op for op in requests if not isinstance(op, OpSequence)]
    assert not [op for op in alone if may_sequence(op)]
    assert sorted(type(op).__name__ for op in alone) == \
        ["Download"] * replicas + ["Upload"] * 3 * replicas  # x, y, Adam's hyper_values; the stats
    # A replica: zeroing, forward, loss and the last layer's backward, the first layer's
    # backward, the check and the updates: five sequences holding 14 ops.
    assert len(sequences) == 5 * replicas
    assert sum(len(op.ops) for op in sequences) == 14 * replicas
    assert math.isfinite(loss)
    trainer.stop()


def test_a_device_without_the_graph_library_trains_op_by_op(system: System) -> None:
    """Sequences run on the graph library's actor; a device without it gets each op alone,
    with the same numbers."""
    x, y = batches(8, 1, seed=7)[0]
    losses = []
    for libraries in (None, ["blas", "train", "cudnn"]):
        device = system.spawn_device(mock=True, libraries=libraries)
        replica = ModelReplica.create(device, MLP, loss=MSELoss(), optimizer=ADAM,
                                      dtype="f64", seed=3)
        losses.append([replica.train_step(x, y) for _ in range(3)])
    np.testing.assert_allclose(losses[0], losses[1], rtol=RTOL, atol=ATOL)
