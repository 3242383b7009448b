"""DataParallelTrainer on CUDA: NCCL against the CPU backend, a poisoned context mid-training
on two GPUs, and TorchModule against plain torch.

Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``; the two-replica tests
need two GPUs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, System
from atomr_accel.backends import cuda_device_count
from atomr_accel.facade import Device
from atomr_accel.train import (
    SGD,
    Adam,
    CrossEntropyLoss,
    DataParallelTrainer,
    Linear,
    MSELoss,
    ReLU,
    Sequential,
    StepResult,
    TorchModule,
)

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(cuda_device_count() < 2,
                              reason=f"needs 2 CUDA devices; this machine has "
                                     f"{cuda_device_count()}")

Array = np.ndarray[Any, Any]
MODEL = Sequential(Linear(64, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10))


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-dp-gpu") as s:
        yield s


def spawn(system: System, n: int, mock: bool, isolation: str = "thread") -> list[Device]:
    return [system.spawn_device(i, mock=mock, isolation=isolation)  # type: ignore[arg-type]
            for i in range(n)]


def classification(rows: int, steps: int, seed: int = 0) -> tuple[list[Array], list[Array]]:
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((10, 64)).astype(np.float32)
    xs, ys = [], []
    for _ in range(steps):
        labels = rng.integers(0, 10, rows)
        xs.append((centers[labels] + 0.5 * rng.standard_normal((rows, 64))).astype(np.float32))
        ys.append(labels.astype(np.int64))
    return xs, ys


def digits() -> tuple[Array, Array, Array, Array]:
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1437], y[:1437], x[1437:], y[1437:]


def states_agree(states: list[dict[str, Array]]) -> None:
    for other in states[1:]:
        for key, value in states[0].items():
            np.testing.assert_array_equal(other[key], value, err_msg=key)


@two_gpus
def test_nccl_training_matches_the_cpu_backend(system: System) -> None:
    xs, ys = classification(256, 12)
    runs = []
    for mock in (False, True):
        trainer = DataParallelTrainer.spawn(system, MODEL, loss=CrossEntropyLoss(),
                                            optimizer=Adam(lr=1e-3), devices=spawn(system, 2, mock),
                                            seed=5)
        trainer.ready(timeout_secs=120)
        losses = [float(trainer.step(x, y, timeout_secs=60)) for x, y in zip(xs, ys, strict=True)]
        states_agree(trainer.replica_states(timeout_secs=60))
        runs.append((losses, trainer.state_dict(timeout_secs=60)))
    (cuda_losses, cuda_state), (cpu_losses, cpu_state) = runs
    np.testing.assert_allclose(cuda_losses, cpu_losses, rtol=2e-3)
    assert cuda_losses[-1] < cuda_losses[0]
    for key, value in cpu_state.items():
        np.testing.assert_allclose(cuda_state[key], value, rtol=2e-3, atol=2e-4, err_msg=key)


@two_gpus
def test_a_poisoned_context_mid_training_on_two_gpus(system: System) -> None:
    x, y, x_test, y_test = digits()
    rng = np.random.default_rng(1)
    order = [p[i:i + 64] for p in (rng.permutation(len(x)) for _ in range(10))
             for i in range(0, len(x), 64)]
    devices = spawn(system, 2, False, "process")
    reference = DataParallelTrainer.spawn(system, MODEL, loss=CrossEntropyLoss(),
                                          optimizer=Adam(lr=2e-3), devices=spawn(system, 2, False))
    trainer = DataParallelTrainer.spawn(system, MODEL, loss=CrossEntropyLoss(),
                                        optimizer=Adam(lr=2e-3), devices=devices)
    trainer.ready(timeout_secs=180)

    async def poisoned_step(rows: Array) -> StepResult:
        step = asyncio.ensure_future(trainer.step_async(x[rows], y[rows], timeout_secs=120))
        await asyncio.sleep(0.001)
        with pytest.raises(ContextPoisoned):
            await devices[1].inject_fault_async(FaultKind.POISON)  # a real illegal address
        return await step

    for index, rows in enumerate(order):
        reference.step(x[rows], y[rows], timeout_secs=60)
        if index == len(order) // 2:
            result = system._portal.call(poisoned_step(rows))
            print(f"\n  poisoned step: {result!r}, replicas rebuilt {result.recovered}")
        else:
            trainer.step(x[rows], y[rows], timeout_secs=60)
    stats = trainer.stats()
    assert stats.recoveries >= 1 and devices[1].generation >= 2
    states = trainer.replica_states(timeout_secs=60)
    states_agree(states)
    for key, value in reference.state_dict(timeout_secs=60).items():
        np.testing.assert_allclose(states[0][key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    accuracy = trainer.evaluate(x_test, y_test)["accuracy"]
    print(f"  digits on 2 GPUs with a poisoned context: accuracy {accuracy:.4f}, "
          f"recovery {stats.last_recovery_seconds:.2f} s")
    assert accuracy >= 0.97
    assert accuracy == reference.evaluate(x_test, y_test)["accuracy"]


def torch_net(torch: Any) -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def torch_steps(torch: Any, model: Any, optim: Any, loss_of: Any, xs: list[Array],
                ys: list[Array]) -> list[float]:
    """A plain torch loop of ``model`` (on the GPU) over the batches: its losses."""
    out = []
    for x, y in zip(xs, ys, strict=True):
        optim.zero_grad()
        loss = loss_of(model(torch.from_numpy(x).cuda()), torch.from_numpy(y).cuda())
        loss.backward()
        optim.step()
        out.append(loss.item())
    return out


def torch_losses(torch: Any, net: Any, xs: list[Array], ys: list[Array]) -> list[float]:
    model = TorchModule(net).copy_module().cuda()
    optim = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    return torch_steps(torch, model, optim, torch.nn.functional.cross_entropy, xs, ys)


def test_torch_module_matches_plain_torch_on_one_gpu(system: System) -> None:
    torch = pytest.importorskip("torch")
    net = torch_net(torch)
    xs, ys = classification(128, 10, seed=4)
    expected = torch_losses(torch, net, xs, ys)
    trainer = DataParallelTrainer.spawn(system, TorchModule(net, bucket_bytes=1 << 16),
                                        loss=CrossEntropyLoss(), optimizer=Adam(lr=1e-3),
                                        devices=spawn(system, 1, False))
    got = [float(trainer.step(x, y, timeout_secs=60)) for x, y in zip(xs, ys, strict=True)]
    print(f"\n  TorchModule losses {np.round(got, 5).tolist()}")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@two_gpus
def test_torch_module_on_two_gpus_matches_torch_on_the_whole_batch(system: System) -> None:
    torch = pytest.importorskip("torch")
    net = torch_net(torch)
    xs, ys = classification(256, 10, seed=6)
    expected = torch_losses(torch, net, xs, ys)
    trainer = DataParallelTrainer.spawn(system, TorchModule(net), loss=CrossEntropyLoss(),
                                        optimizer=Adam(lr=1e-3),
                                        devices=spawn(system, 2, False))
    got = [float(trainer.step(x, y, timeout_secs=60)) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    states = trainer.replica_states(timeout_secs=60)
    states_agree([{k: v for k, v in s.items() if k != "step"} for s in states])


@pytest.mark.parametrize("gpus", [1, 2])
def test_torch_module_with_large_batches_and_micro_batches_matches_torch(
        system: System, gpus: int) -> None:
    """Batches past the page-locked threshold (x and y each 2 MiB a replica), new data every
    step, two micro-batches a replica (a page-locked tensor refilled within a step) and a
    bucket a layer: the losses and parameters equal plain torch's on the whole batch."""
    torch = pytest.importorskip("torch")
    if cuda_device_count() < gpus:
        pytest.skip(f"needs {gpus} CUDA devices")
    torch.manual_seed(1)
    width, rows = 512, 1024 * gpus
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, width))
    rng = np.random.default_rng(9)
    xs = [rng.standard_normal((2 * rows, width)).astype(np.float32) for _ in range(4)]
    ys = [rng.standard_normal((2 * rows, width)).astype(np.float32) for _ in range(4)]
    model = TorchModule(net).copy_module().cuda()
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    expected = torch_steps(torch, model, optim, torch.nn.functional.mse_loss, xs, ys)
    trainer = DataParallelTrainer.spawn(system, TorchModule(net, bucket_bytes=width * width * 4),
                                        loss=MSELoss(), optimizer=SGD(lr=0.05, momentum=0.9),
                                        devices=spawn(system, gpus, False), micro_batch=rows)
    got = [float(trainer.step(x, y, timeout_secs=60)) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    states = trainer.replica_states(timeout_secs=60)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(states[0][name], value.cpu().numpy(), rtol=1e-3,
                                   atol=1e-5, err_msg=name)
    trainer.stop()


def test_the_original_form_on_gpus(system: System) -> None:
    trainer = DataParallelTrainer.spawn(system, min(2, cuda_device_count()), 4, 0.05)
    batch = [[1.0, 2.0], [3.0, 4.0], [0.5, -1.0], [2.0, 0.0]]
    first, grad_norm, micros = trainer.step(batch, 60.0)
    for _ in range(200):
        last = trainer.step(batch, 60.0)
    assert grad_norm > 0 and micros > 0 and float(last) < 1e-3 < first
    assert trainer.stats().replicas == min(2, cuda_device_count())


def test_sgd_on_one_gpu_matches_the_cpu_backend(system: System) -> None:
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(5)]
    ys = [rng.standard_normal((64, 10)).astype(np.float32) for _ in range(5)]
    states = []
    for mock in (False, True):
        trainer = DataParallelTrainer.spawn(system, MODEL, loss=MSELoss(),
                                            optimizer=SGD(lr=0.05, momentum=0.9),
                                            devices=spawn(system, 1, mock))
        for x, y in zip(xs, ys, strict=True):
            trainer.step(x, y, timeout_secs=60)
        states.append(trainer.state_dict(timeout_secs=60))
    for key, value in states[1].items():
        np.testing.assert_allclose(states[0][key], value, rtol=2e-3, atol=2e-4, err_msg=key)
