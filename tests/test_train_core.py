"""The training core (``atomr_accel.train``) on the CPU backend, against NumPy references.

Every layer and loss is checked in float64: the replica's forward against an
independent NumPy forward written here, and its gradients (parameters and
input) against central finite differences of that NumPy forward. Optimizer
updates are checked step by step against torch.optim's formulas written out
here, schedules against their formula, a state_dict round trip by identical
predictions and an identical next step, and an MLP on scikit-learn's digits
must reach 97% test accuracy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.special import erf

from atomr_accel import DTypeMismatch, InvalidArgument, System
from atomr_accel.train import (
    GELU,
    SGD,
    Adam,
    AdamW,
    CrossEntropyLoss,
    Dropout,
    Flatten,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    Sigmoid,
    Tanh,
    WarmupCosine,
)

Array = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-core") as opened:
        yield opened


@pytest.fixture(scope="module")
def device(system: System) -> Any:
    return system.spawn_device(mock=True)


# ------------------------------------------------------------ NumPy references


def np_forward(model: Sequential, params: dict[str, Array], x: Array) -> Array:
    """The model's forward in float64 NumPy, written independently of the library."""
    h = np.asarray(x, dtype=np.float64)
    for index, layer in zip(model.indices, model.layers, strict=True):
        if isinstance(layer, Linear):
            h = h @ params[f"{index}.weight"].T
            if layer.bias:
                h = h + params[f"{index}.bias"]
        elif isinstance(layer, LayerNorm):
            mu = h.mean(-1, keepdims=True)
            var = ((h - mu) ** 2).mean(-1, keepdims=True)
            h = (h - mu) / np.sqrt(var + layer.eps) * params[f"{index}.weight"] \
                + params[f"{index}.bias"]
        elif isinstance(layer, ReLU):
            h = np.maximum(h, 0)
        elif isinstance(layer, GELU) and layer.approximate == "none":
            h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        elif isinstance(layer, GELU):
            h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        elif isinstance(layer, Tanh):
            h = np.tanh(h)
        elif isinstance(layer, Sigmoid):
            h = 1 / (1 + np.exp(-h))
        elif isinstance(layer, Flatten):
            h = h.reshape(h.shape[0], -1)
        elif isinstance(layer, Dropout):
            pass  # evaluation
        else:
            raise AssertionError(layer)
    return h


def np_loss(loss: Any, out: Array, y: Array) -> float:
    if isinstance(loss, MSELoss):
        return float(((out - y) ** 2).mean())
    classes = out.shape[1]
    z = out - out.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    s = loss.label_smoothing
    target = (1 - s) * np.eye(classes)[y] + s / classes
    return float(-(target * logp).sum(1).mean())


def finite_difference(f: Callable[[], float], array: Array, eps: float = 1e-6) -> Array:
    """Central differences of ``f`` against every element of ``array`` (changed in place)."""
    grad = np.zeros_like(array)
    flat, out = array.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + eps
        up = f()
        flat[i] = keep - eps
        down = f()
        flat[i] = keep
        out[i] = (up - down) / (2 * eps)
    return grad


# ------------------------------------------------------------ gradient checks

CASES = [
    ("linear-relu", Sequential(Linear(5, 4), ReLU(), Linear(4, 3)), MSELoss()),
    ("linear-nobias", Sequential(Linear(5, 4, bias=False), Tanh(), Linear(4, 3)), MSELoss()),
    ("gelu", Sequential(Linear(5, 4), GELU(), Linear(4, 3)), CrossEntropyLoss()),
    ("gelu-tanh", Sequential(Linear(5, 4), GELU("tanh"), Linear(4, 3)), MSELoss()),
    ("tanh", Sequential(Linear(5, 4), Tanh(), Linear(4, 3)), CrossEntropyLoss(0.2)),
    ("sigmoid", Sequential(Linear(5, 4), Sigmoid(), Linear(4, 3)), MSELoss()),
    ("layernorm", Sequential(Linear(5, 4), LayerNorm(4), Linear(4, 3)), CrossEntropyLoss()),
    ("flatten", Sequential(Flatten(), Linear(6, 4), ReLU(), LayerNorm(4, eps=1e-3),
                           Linear(4, 3)), CrossEntropyLoss(0.1)),
    ("cross-entropy", Sequential(Linear(5, 4)), CrossEntropyLoss()),
    ("cross-entropy-smoothed", Sequential(Linear(5, 4)), CrossEntropyLoss(0.3)),
    ("mse", Sequential(Linear(5, 4)), MSELoss()),
]


@pytest.mark.parametrize(("model", "loss"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_forward_and_gradients_match_numpy_in_float64(device: Any, model: Sequential,
                                                      loss: Any) -> None:
    rng = np.random.default_rng(7)
    shape = (6, 2, 3) if isinstance(model[0], Flatten) else (6, 5)
    x = rng.normal(size=shape)
    params = {k: rng.normal(size=v.shape) * 0.8
              for k, v in model.init_parameters(0, "f64").items()}
    replica = ModelReplica.create(device, model, loss=loss, optimizer=SGD(0.1),
                                  parameters=params, dtype="f64")
    out_features = model.features_out(6 if len(shape) == 3 else 5)
    y = (rng.integers(0, out_features, 6) if isinstance(loss, CrossEntropyLoss)
         else rng.normal(size=(6, out_features)))
    out = replica.forward(x)
    got = replica.device.copy_to_numpy(out)[: 6 * out_features].reshape(6, out_features)
    np.testing.assert_allclose(got, np_forward(model, params, x), rtol=1e-12, atol=1e-12)
    value = replica.compute_loss(y)
    assert value == pytest.approx(np_loss(loss, np_forward(model, params, x), y), rel=1e-12)
    replica.zero_grad()
    dx_buf = replica.backward(want_input_grad=True)
    assert dx_buf is not None
    dx = replica.device.copy_to_numpy(dx_buf)[: x.size].reshape(x.shape)
    grads = replica.gradients()

    def f() -> float:
        return np_loss(loss, np_forward(model, params, x), y)

    for name, value_array in params.items():
        np.testing.assert_allclose(grads[name], finite_difference(f, value_array),
                                   rtol=1e-6, atol=1e-8, err_msg=name)
    np.testing.assert_allclose(dx, finite_difference(f, x), rtol=1e-6, atol=1e-8)


def test_gradients_accumulate_over_micro_batches_in_flight(device: Any) -> None:
    model = Sequential(Linear(5, 8), GELU(), LayerNorm(8), Linear(8, 3))
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=(4, 5)) for _ in range(2)]
    ys = [rng.integers(0, 3, 4) for _ in range(2)]
    replica = ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=SGD(0.1),
                                  dtype="f64", seed=5)
    params = replica.parameters()
    replica.forward(xs[0], micro_batch=0)
    replica.forward(xs[1], micro_batch=1)  # both in flight, as in 1F1B
    replica.compute_loss(ys[1], micro_batch=1)
    replica.compute_loss(ys[0], micro_batch=0)
    replica.zero_grad()
    positions: list[int] = []
    replica.backward(micro_batch=1, bucket_ready=positions.append)
    replica.backward(micro_batch=0)
    assert positions == [0, 1, 2]  # last layer's bucket first
    assert replica.bucket_names(0) == ["3.weight", "3.bias"]
    grads = replica.gradients()

    def f() -> float:
        return sum(np_loss(CrossEntropyLoss(), np_forward(model, params, x), y)
                   for x, y in zip(xs, ys, strict=True))

    for name, value in params.items():
        np.testing.assert_allclose(grads[name], finite_difference(f, value), rtol=1e-6,
                                   atol=1e-8, err_msg=name)


def test_dropout_masks_scale_and_backpropagate(device: Any) -> None:
    model = Sequential(Linear(6, 64, bias=False), Dropout(0.25))
    replica = ModelReplica.create(device, model, loss=MSELoss(), optimizer=SGD(0.1),
                                  dtype="f64", seed=11)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 6))
    full = x @ replica.parameters()["0.weight"].T
    out = replica.device.copy_to_numpy(replica.forward(x))[: full.size].reshape(full.shape)
    kept = out != 0
    assert 0.65 < kept.mean() < 0.85
    np.testing.assert_allclose(out[kept], full[kept] / 0.75, rtol=1e-12)
    dy = rng.normal(size=full.shape)
    replica.zero_grad()
    replica.backward(dy)
    np.testing.assert_allclose(replica.gradients()["0.weight"], (dy * kept / 0.75).T @ x,
                               rtol=1e-10)
    again = replica.device.copy_to_numpy(replica.forward(x, train=False))[: full.size]
    np.testing.assert_allclose(again.reshape(full.shape), full, rtol=1e-12)
    np.testing.assert_allclose(replica.predict(x), full, rtol=1e-12)


# ------------------------------------------------------------------- optimizers


class TorchFormulas:
    """torch.optim's update rules, written out (the reference of the optimizer tests)."""

    def __init__(self, opt: Any, params: dict[str, Array]) -> None:
        self.opt = opt
        self.p = {k: v.astype(np.float64).copy() for k, v in params.items()}
        self.state: dict[str, dict[str, Array]] = {k: {} for k in params}
        self.t = 0

    def step(self, grads: dict[str, Array], grad_scale: float) -> None:
        opt, self.t = self.opt, self.t + 1
        lr = opt.lr if opt.schedule is None else opt.schedule.lr(opt.lr, self.t - 1)
        for k, p in self.p.items():
            g = grads[k] * grad_scale
            st = self.state[k]
            if isinstance(opt, SGD):
                if opt.weight_decay:
                    g = g + opt.weight_decay * p
                if opt.momentum:
                    st["buf"] = g.copy() if "buf" not in st else opt.momentum * st["buf"] + g
                    g = g + opt.momentum * st["buf"] if opt.nesterov else st["buf"]
                p[...] = p - lr * g
                continue
            b1, b2 = opt.betas
            if isinstance(opt, AdamW):
                p[...] = p * (1 - lr * opt.weight_decay)
            elif opt.weight_decay:
                g = g + opt.weight_decay * p
            st["m"] = b1 * st.get("m", 0) + (1 - b1) * g
            st["v"] = b2 * st.get("v", 0) + (1 - b2) * g * g
            denom = np.sqrt(st["v"]) / math.sqrt(1 - b2 ** self.t) + opt.eps
            p[...] = p - lr / (1 - b1 ** self.t) * st["m"] / denom


OPTIMIZERS = [
    SGD(0.1),
    SGD(0.05, momentum=0.9),
    SGD(0.05, momentum=0.8, nesterov=True, weight_decay=1e-2),
    Adam(1e-2),
    Adam(1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    AdamW(1e-2),
    AdamW(3e-2, weight_decay=0.3, schedule=WarmupCosine(2, 5, min_lr=1e-3)),
    SGD(0.2, momentum=0.5, schedule=WarmupCosine(3, 6)),
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=repr)
def test_optimizer_updates_follow_torch_formulas(device: Any, opt: Any) -> None:
    model = Sequential(Linear(4, 6), Tanh(), LayerNorm(6), Linear(6, 2))
    replica = ModelReplica.create(device, model, loss=MSELoss(), optimizer=opt, dtype="f64",
                                  seed=2)
    ref = TorchFormulas(opt, replica.parameters())
    rng = np.random.default_rng(4)
    for step in range(6):
        x, y = rng.normal(size=(8, 4)), rng.normal(size=(8, 2))
        replica.zero_grad()
        replica.forward(x)
        replica.compute_loss(y)
        replica.backward()
        scale = 0.5 if step % 2 else 1.0
        ref.step(replica.gradients(), scale)
        replica.optimizer_step(grad_scale=scale)
        for name, value in replica.parameters().items():
            np.testing.assert_allclose(value, ref.p[name], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name} after step {step + 1}")
    assert replica.step == 6


def test_train_step_is_zero_forward_loss_backward_update(device: Any) -> None:
    model = Sequential(Linear(4, 5), ReLU(), Linear(5, 3))
    a = ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=Adam(1e-2),
                            seed=9)
    b = ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=Adam(1e-2),
                            seed=9)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x, y = rng.normal(size=(7, 4)).astype(np.float32), rng.integers(0, 3, 7)
        loss = a.train_step(x, y)
        b.zero_grad()
        b.forward(x)
        assert b.compute_loss(y) == loss
        b.backward()
        b.optimizer_step()
    for name, value in a.parameters().items():
        np.testing.assert_array_equal(value, b.parameters()[name])


def test_warmup_cosine_schedule() -> None:
    sched = WarmupCosine(4, 14, min_lr=0.01)
    want = [0.1 * (s + 1) / 4 for s in range(4)] + [
        0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 4) / 10)))
        for s in range(4, 20)]
    got = [SGD(0.1, schedule=sched).lr_at(s) for s in range(20)]
    np.testing.assert_allclose(got, want, rtol=1e-15)
    assert got[13] > got[14] == pytest.approx(0.01) == got[19]
    assert SGD(0.1).lr_at(100) == 0.1


# -------------------------------------------------------------------- state


def test_state_dict_round_trip_through_a_file(device: Any, tmp_path: Path) -> None:
    model = Sequential(Linear(4, 8), GELU(), LayerNorm(8), Linear(8, 3))
    opt = AdamW(1e-2, schedule=WarmupCosine(2, 10))
    a = ModelReplica.create(device, model, loss=CrossEntropyLoss(0.1), optimizer=opt, seed=1)
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(10, 4)).astype(np.float32), rng.integers(0, 3, 10)
    for _ in range(3):
        a.train_step(x, y)
    path = tmp_path / "replica.npz"
    a.save(path)
    b = ModelReplica.create(device, model, loss=CrossEntropyLoss(0.1), optimizer=opt, seed=99)
    assert not np.array_equal(a.predict(x), b.predict(x))
    b.load(path)
    assert b.step == 3
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    state = a.state_dict()
    assert set(state) == set(b.state_dict())
    assert {"optimizer.0.weight.exp_avg", "optimizer.3.bias.exp_avg_sq",
            "optimizer.step"} <= set(state)
    assert a.train_step(x, y) == b.train_step(x, y)
    for name, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[name], err_msg=name)


def test_parameters_by_torch_name_and_init(device: Any) -> None:
    model = Sequential(Linear(3, 4), ReLU(), LayerNorm(4), Linear(4, 2, bias=False))
    assert model.parameter_shapes() == {"0.weight": (4, 3), "0.bias": (4,), "2.weight": (4,),
                                        "2.bias": (4,), "3.weight": (2, 4)}
    init = model.init_parameters(3)
    assert all(v.dtype == np.float32 for v in init.values())
    assert np.abs(init["0.weight"]).max() <= 1 / math.sqrt(3)
    np.testing.assert_array_equal(init["2.weight"], np.ones(4))
    stage = model[2:]
    assert isinstance(stage, Sequential) and stage.indices == (2, 3)
    assert list(stage.parameter_shapes()) == ["2.weight", "2.bias", "3.weight"]
    replica = ModelReplica.create(device, stage, loss=MSELoss(), optimizer=SGD(0.1),
                                  parameters={k: init[k] for k in stage.parameter_shapes()})
    for name, value in replica.parameters().items():
        np.testing.assert_array_equal(value, init[name])


def test_batches_of_changing_size_reuse_the_work_buffers(device: Any) -> None:
    model = Sequential(Linear(3, 5), Sigmoid(), Linear(5, 2))
    replica = ModelReplica.create(device, model, loss=MSELoss(), optimizer=SGD(0.1),
                                  dtype="f64", seed=4)
    rng = np.random.default_rng(8)
    for rows in (9, 4, 9, 1, 6):
        params = replica.parameters()
        x, y = rng.normal(size=(rows, 3)), rng.normal(size=(rows, 2))
        want = np_loss(MSELoss(), np_forward(model, params, x), y)
        assert replica.train_step(x, y) == pytest.approx(want, rel=1e-12)
        assert replica.output_shape() == (rows, 2)
        np.testing.assert_allclose(replica.predict(x), np_forward(
            model, replica.parameters(), x), rtol=1e-12)


def test_a_replica_in_a_worker_process_trains_as_in_a_thread(system: System,
                                                             device: Any) -> None:
    worker = system.spawn_device(mock=True, isolation="process")
    model = Sequential(Linear(6, 8), GELU(), LayerNorm(8), Dropout(0.2), Linear(8, 3))
    opt = SGD(0.1, momentum=0.9)
    a = ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=opt, seed=6)
    b = ModelReplica.create(worker, model, loss=CrossEntropyLoss(), optimizer=opt, seed=6)
    rng = np.random.default_rng(9)
    for _ in range(3):
        x, y = rng.normal(size=(12, 6)).astype(np.float32), rng.integers(0, 3, 12)
        assert a.train_step(x, y) == b.train_step(x, y)
    for name, value in a.state_dict().items():
        np.testing.assert_array_equal(value, b.state_dict()[name], err_msg=name)


# ---------------------------------------------------------------------- digits


def test_digits_mlp_reaches_97_percent(device: Any) -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x, y = (digits.data / 16.0).astype(np.float32), digits.target
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    test, train = order[:360], order[360:]
    epochs, batch = 15, 64
    steps = epochs * math.ceil(len(train) / batch)
    started = time.perf_counter()
    replica = ModelReplica.create(
        device, Sequential(Linear(64, 128), ReLU(), Linear(128, 10)), loss=CrossEntropyLoss(),
        optimizer=AdamW(5e-3, schedule=WarmupCosine(20, steps)), seed=0)
    for _ in range(epochs):
        perm = rng.permutation(train)
        for i in range(0, len(perm), batch):
            replica.train_step(x[perm[i: i + batch]], y[perm[i: i + batch]])
    accuracy = (replica.predict(x[test]).argmax(1) == y[test]).mean()
    print(f"digits: {accuracy:.4f} test accuracy in {time.perf_counter() - started:.1f} s")
    assert accuracy >= 0.97


# ---------------------------------------------------------------- typed errors


@pytest.mark.parametrize("make", [
    lambda: Linear(0, 3),
    lambda: Linear(2, 3, bias=1),
    lambda: LayerNorm(4, eps=0),
    lambda: Dropout(1.0),
    lambda: GELU("erf"),
    Sequential,
    lambda: Sequential(Linear(2, 3), "relu"),
    lambda: CrossEntropyLoss(1.0),
    lambda: SGD(-0.1),
    lambda: SGD(0.1, nesterov=True),
    lambda: Adam(betas=(0.9, 1.0)),
    lambda: AdamW(eps=0),
    lambda: WarmupCosine(5, 3),
    lambda: SGD(0.1, schedule="cosine"),
    lambda: Sequential(Linear(2, 3)).init_parameters(0, "f16"),
])
def test_bad_descriptions_raise_invalid_argument(make: Callable[[], Any]) -> None:
    with pytest.raises(InvalidArgument):
        make()


def test_bad_calls_raise_typed_errors_and_the_replica_goes_on(device: Any) -> None:
    model = Sequential(Linear(4, 3))
    r = ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=SGD(0.1))
    x = np.ones((2, 4), np.float32)
    with pytest.raises(InvalidArgument):
        ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=SGD(0.1),
                            parameters={"0.weight": np.ones((3, 4))})
    with pytest.raises(InvalidArgument):
        ModelReplica.create(device, model, loss=CrossEntropyLoss(), optimizer=SGD(0.1),
                            parameters={"0.weight": np.ones((4, 3)), "0.bias": np.ones(3)})
    with pytest.raises(InvalidArgument):
        ModelReplica.create(device, model, loss="mse", optimizer=SGD(0.1))  # type: ignore
    with pytest.raises(InvalidArgument):
        ModelReplica.create(device, model, loss=MSELoss(), optimizer=SGD(0.1), timeout_secs=0)
    with pytest.raises(InvalidArgument):
        r.forward(np.ones((2, 5), np.float32))
    with pytest.raises(DTypeMismatch):
        r.forward(np.array([["a"] * 4] * 2))
    with pytest.raises(InvalidArgument):
        r.backward(micro_batch=7)
    with pytest.raises(InvalidArgument):
        r.compute_loss(np.array([0, 1]), micro_batch=3)
    r.forward(x)
    with pytest.raises(InvalidArgument):
        r.backward()  # no loss yet
    with pytest.raises(InvalidArgument):
        r.compute_loss(np.array([0, 3]))
    with pytest.raises(DTypeMismatch):
        r.compute_loss(np.array([0.0, 1.0]))
    with pytest.raises(InvalidArgument):
        r.optimizer_step(grad_scale=float("nan"))
    with pytest.raises(InvalidArgument):
        r.load_state_dict({"0.weight": np.ones((3, 4))})
    with pytest.raises(InvalidArgument):
        r.load_state_dict(r.state_dict() | {"1.weight": np.ones(3)})
    assert r.train_step(x, np.array([0, 2])) > 0
