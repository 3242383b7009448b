"""The training core on CUDA: every train op against the CPU backend, and models against torch.

Each op runs on the same random data on a CUDA device and on a CPU device;
outputs must agree to float32 round-off (1e-4 relative) or float64 round-off
(1e-10). A model's loss, gradients and AdamW/SGD steps on CUDA are compared
with the same model in torch (weights copied by name). Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_train_core.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.core import DType, GpuRef
from atomr_accel.core._op import Op
from atomr_accel.core.ops._train import (
    AdamUpdate,
    FillZeros,
    LayerNormBackward,
    LayerNormForward,
    LinearBackward,
    LinearForward,
    MseLoss,
    SgdUpdate,
    SoftmaxCrossEntropy,
)
from atomr_accel.train import (
    GELU,
    SGD,
    AdamW,
    CrossEntropyLoss,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    ReLU,
    Sequential,
    Tanh,
)

pytestmark = pytest.mark.gpu

Array = np.ndarray[Any, Any]
Make = Callable[[dict[str, GpuRef]], Op]


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Any, Any]]:
    with System.open("train-core-gpu") as system:
        yield system.spawn_device(mock=True), system.spawn_device(mock=False)


def run_on(device: Any, arrays: dict[str, Array], make: Make,
           outputs: tuple[str, ...]) -> dict[str, Array]:
    """Upload ``arrays``, run the op ``make`` builds on their refs, download ``outputs``."""
    buffers = {}
    for name, value in arrays.items():
        buf = device.allocate(value.size, DType.of(value.dtype))
        device.copy_from_numpy(buf, value.reshape(-1))
        buffers[name] = buf
    device.run(make({k: b.ref for k, b in buffers.items()}), 60.0)
    return {k: device.copy_to_numpy(buffers[k]) for k in outputs}


def rand(rng: np.random.Generator, n: int, dtype: Any, low: float = -1.0,
         high: float = 1.0) -> Array:
    return rng.uniform(low, high, n).astype(dtype)


def cases(dtype: Any) -> list[tuple[str, dict[str, Array], Make, tuple[str, ...]]]:
    rng = np.random.default_rng(12)
    rows, fin, fout = 96, 72, 40
    w = fin * fout
    lin = {"x": rand(rng, rows * fin, dtype), "params": rand(rng, w + fout + 3, dtype),
           "y": rand(rng, rows * fout, dtype)}
    back = {"x": rand(rng, rows * fin, dtype), "params": rand(rng, w + fout, dtype),
            "dy": rand(rng, rows * fout, dtype), "grads": rand(rng, w + fout, dtype),
            "dx": rand(rng, rows * fin, dtype)}
    back_offset = {"x": rand(rng, rows * fin, dtype), "params": rand(rng, 3 + w + fout, dtype),
                   "dy": rand(rng, rows * fout, dtype),
                   "grads": rand(rng, 3 + w + fout + 2, dtype)}
    n = 48
    norm = {"x": rand(rng, rows * n, dtype, -3, 3), "params": rand(rng, 2 * n, dtype),
            "y": rand(rng, rows * n, dtype), "mean": rand(rng, rows, dtype),
            "rstd": rand(rng, rows, dtype)}
    norm_back = {"x": rand(rng, rows * n, dtype, -3, 3), "params": rand(rng, 2 * n, dtype),
                 "dy": rand(rng, rows * n, dtype), "mean": rand(rng, rows, dtype),
                 "rstd": rand(rng, rows, dtype, 0.5, 2.0), "grads": rand(rng, 2 * n, dtype),
                 "dx": rand(rng, rows * n, dtype)}
    classes = 10
    labels = rng.integers(0, classes, rows).astype(np.int32)
    labels[5] = -1  # no class: only the smoothing term, on every backend
    ce = {"logits": rand(rng, rows * classes, dtype, -5, 5), "labels": labels,
          "loss": rand(rng, 1, dtype), "grad": rand(rng, rows * classes, dtype)}
    mse = {"pred": rand(rng, 500, dtype), "target": rand(rng, 500, dtype),
           "loss": rand(rng, 1, dtype), "grad": rand(rng, 500, dtype)}
    size = 10_000

    def update() -> dict[str, Array]:
        return {"p": rand(rng, size, dtype), "g": rand(rng, size, dtype),
                "a": rand(rng, size, dtype), "b": rand(rng, size, dtype, 0.0, 1.0)}

    return [
        ("linear_forward", lin, lambda r: LinearForward(
            r["x"], r["params"], r["y"], rows, fin, fout, 0, w), ("y",)),
        ("linear_forward_offset_nobias", lin, lambda r: LinearForward(
            r["x"], r["params"], r["y"], rows, fin, fout, 3, None), ("y",)),
        ("linear_backward", back, lambda r: LinearBackward(
            r["x"], r["params"], r["dy"], r["grads"], r["dx"], rows, fin, fout, 0, w),
         ("grads", "dx")),
        ("linear_backward_offset_nodx", back_offset, lambda r: LinearBackward(
            r["x"], r["params"], r["dy"], r["grads"], None, rows, fin, fout, 3, 3 + w),
         ("grads",)),
        ("layer_norm_forward", norm, lambda r: LayerNormForward(
            r["x"], r["params"], r["y"], r["mean"], r["rstd"], rows, n, 0, n, 1e-5),
         ("y", "mean", "rstd")),
        ("layer_norm_backward", norm_back, lambda r: LayerNormBackward(
            r["x"], r["params"], r["dy"], r["mean"], r["rstd"], r["grads"], r["dx"], rows, n,
            n, 0), ("grads", "dx")),
        ("softmax_cross_entropy", ce, lambda r: SoftmaxCrossEntropy(
            r["logits"], r["labels"], r["loss"], r["grad"], rows, classes, 0.1, 0.5),
         ("loss", "grad")),
        ("mse", mse, lambda r: MseLoss(r["pred"], r["target"], r["loss"], r["grad"], 480, 2.0),
         ("loss", "grad")),
        ("sgd", update(), lambda r: SgdUpdate(
            r["p"], r["g"], None, 100, 9000, 0.1, weight_decay=0.01, grad_scale=0.5),
         ("p",)),
        ("sgd_momentum_first", update(), lambda r: SgdUpdate(
            r["p"], r["g"], r["a"], 0, size, 0.1, 0.9, first_step=True), ("p", "a")),
        ("sgd_nesterov", update(), lambda r: SgdUpdate(
            r["p"], r["g"], r["a"], 7, 5000, 0.05, 0.8, True, 1e-3, 0.25), ("p", "a")),
        ("adam", update(), lambda r: AdamUpdate(
            r["p"], r["g"], r["a"], r["b"], 0, size, 1e-2, 3, weight_decay=0.1), ("p", "a", "b")),
        ("adamw", update(), lambda r: AdamUpdate(
            r["p"], r["g"], r["a"], r["b"], 11, 8000, 1e-2, 1, 0.8, 0.99, 1e-6, 0.05, True, 2.0),
         ("p", "a", "b")),
        ("fill_zeros", update(), lambda r: FillZeros(r["p"], 10, 500), ("p",)),
    ]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_every_train_op_on_cuda_matches_the_cpu_backend(devices: tuple[Any, Any],
                                                        dtype: Any) -> None:
    cpu, cuda = devices
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10,
                                                                     "atol": 1e-12}
    for name, arrays, make, outputs in cases(dtype):
        want = run_on(cpu, arrays, make, outputs)
        got = run_on(cuda, arrays, make, outputs)
        for out in outputs:
            np.testing.assert_allclose(got[out], want[out], err_msg=f"{name}: {out}", **tol)


def _torch_model(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 64),
                         nn.Tanh(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10)).cuda()


MODEL = Sequential(Linear(32, 64), GELU(), LayerNorm(64), Linear(64, 64), Tanh(),
                   Linear(64, 48), ReLU(), Linear(48, 10))


def test_a_model_on_cuda_matches_torch(devices: tuple[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    _, cuda = devices
    torch.manual_seed(0)
    net = _torch_model(torch)
    params = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    rng = np.random.default_rng(2)
    x = rng.normal(size=(128, 32)).astype(np.float32)
    y = rng.integers(0, 10, 128)
    opt = AdamW(3e-3, weight_decay=0.05)
    replica = ModelReplica.create(cuda, MODEL, loss=CrossEntropyLoss(0.1), optimizer=opt,
                                  parameters=params)
    torch_opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=0.05)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    # one step by parts: loss and gradients against torch
    replica.zero_grad()
    replica.forward(x)
    loss = replica.compute_loss(y)
    replica.backward()
    torch_opt.zero_grad()
    torch_loss = criterion(net(tx), ty)
    torch_loss.backward()
    assert loss == pytest.approx(torch_loss.item(), rel=1e-5)
    grads = replica.gradients()
    for name, p in net.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.cpu().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    replica.optimizer_step()
    torch_opt.step()
    # four more whole steps
    for _ in range(4):
        loss = replica.train_step(x, y)
        torch_opt.zero_grad()
        torch_loss = criterion(net(tx), ty)
        torch_loss.backward()
        torch_opt.step()
        assert loss == pytest.approx(torch_loss.item(), rel=1e-4)
    got = replica.parameters()
    for name, p in net.named_parameters():
        np.testing.assert_allclose(got[name], p.detach().cpu().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)


def test_mse_and_nesterov_sgd_on_cuda_match_torch(devices: tuple[Any, Any]) -> None:
    torch = pytest.importorskip("torch")
    _, cuda = devices
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                              torch.nn.Linear(32, 4)).cuda()
    model = Sequential(Linear(16, 32), Tanh(), Linear(32, 4))
    params = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    replica = ModelReplica.create(cuda, model, loss=MSELoss(),
                                  optimizer=SGD(0.05, momentum=0.9, nesterov=True,
                                                weight_decay=1e-3), parameters=params)
    torch_opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=1e-3)
    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.normal(size=(64, 16)).astype(np.float32)
        y = rng.normal(size=(64, 4)).astype(np.float32)
        loss = replica.train_step(x, y)
        torch_opt.zero_grad()
        torch_loss = torch.nn.functional.mse_loss(net(torch.from_numpy(x).cuda()),
                                                  torch.from_numpy(y).cuda())
        torch_loss.backward()
        torch_opt.step()
        assert loss == pytest.approx(torch_loss.item(), rel=1e-4)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(replica.parameters()[name], p.detach().cpu().numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=name)


def test_training_on_cuda_follows_the_cpu_backend(devices: tuple[Any, Any]) -> None:
    cpu, cuda = devices
    rng = np.random.default_rng(4)
    x = rng.normal(size=(256, 32)).astype(np.float32)
    y = rng.integers(0, 10, 256)
    opt = AdamW(1e-3)
    a = ModelReplica.create(cpu, MODEL, loss=CrossEntropyLoss(), optimizer=opt, seed=3)
    b = ModelReplica.create(cuda, MODEL, loss=CrossEntropyLoss(), optimizer=opt, seed=3)
    losses = [(a.train_step(x, y), b.train_step(x, y)) for _ in range(10)]
    np.testing.assert_allclose([g for _, g in losses], [w for w, _ in losses], rtol=1e-4)
    assert losses[-1][1] < losses[0][1]
    np.testing.assert_allclose(b.predict(x), a.predict(x), rtol=1e-3, atol=1e-4)
