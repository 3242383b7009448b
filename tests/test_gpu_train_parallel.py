"""The pipeline- and tensor-parallel trainers and the parameter server on two GPUs, checked
against the same runs on CPU devices (the CPU backend). The trainer comparisons use SGD
with momentum: Adam's first updates are ``lr * sign(g)``, which would turn a last-bit
difference of a near-zero gradient into a whole ``lr`` step.

Pipeline activations and gradients move by peer copies (thread hosts) or CUDA IPC
(process hosts); the tensor-parallel all-reduces run on real NCCL. Run on a 2-GPU
machine (NVLink multicast off: ``NCCL_NVLS_ENABLE=0``):
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_train_parallel.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_train_parameter_server import blobs

from atomr_accel import ContextPoisoned, FaultKind, System
from atomr_accel.backends import cuda_device_count
from atomr_accel.facade import Device
from atomr_accel.train import (
    GELU,
    SGD,
    AsyncParameterServer,
    CrossEntropyLoss,
    LayerNorm,
    Linear,
    ModelReplica,
    MSELoss,
    ParameterServerWorker,
    PipelineParallelTrainer,
    ReLU,
    Sequential,
    StaleGradient,
    Tanh,
    TensorParallelTrainer,
    flatten_parameters,
    unflatten_parameters,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    cuda_device_count() < 2,
    reason=f"needs 2 CUDA devices; this machine has {cuda_device_count()}")]

HOSTS = ["thread", "process"]
LAYERS = [Linear(32, 64), GELU(), Linear(64, 48), ReLU(), LayerNorm(48), Linear(48, 10)]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("gpu-train-parallel", op_timeout=120) as opened:
        yield opened


@pytest.fixture(scope="module")
def devices(system: System) -> dict[str, list[Device]]:
    """Two GPUs on each host kind, and two CPU devices for the reference runs."""
    made = {host: [system.spawn_device(i, mock=False, isolation=host, name=f"{host}-{i}")
                   for i in range(2)] for host in HOSTS}
    made["cpu"] = [system.spawn_device(mock=True, name=f"cpu-{i}") for i in range(2)]
    return made


def data(seed: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 10, 64)


def assert_states_close(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("kind", ["1f1b", "gpipe"])
def test_pipeline_on_two_gpus_matches_the_cpu(system: System, devices: dict[str, Any],
                                              host: str, kind: str) -> None:
    x, y = data(1)
    stages = [Sequential(*LAYERS[:3]), Sequential(*LAYERS[3:])]
    runs = {}
    for where in (host, "cpu"):
        trainer = PipelineParallelTrainer.spawn(system, stages, devices[where],
                                                loss=CrossEntropyLoss(),
                                                optimizer=SGD(0.05, momentum=0.9),
                                                micro_batches=3,
                                                schedule=kind, seed=7)
        losses = [float(trainer.step(x, y)) for _ in range(4)]
        runs[where] = (losses, trainer.state_dict(), trainer.predict(x))
        trainer.stop()
    np.testing.assert_allclose(runs[host][0], runs["cpu"][0], rtol=1e-4)
    assert_states_close(runs[host][1], runs["cpu"][1])
    np.testing.assert_allclose(runs[host][2], runs["cpu"][2], rtol=1e-3, atol=1e-4)


def test_pipeline_matches_one_gpu_unsplit(system: System, devices: dict[str, Any]) -> None:
    x, y = data(2)
    gpus = devices["thread"]
    trainer = PipelineParallelTrainer.spawn(
        system, [Sequential(*LAYERS[:2]), Sequential(*LAYERS[2:])], gpus,
        loss=CrossEntropyLoss(), optimizer=SGD(0.1, momentum=0.9), micro_batches=4, seed=3)
    reference = ModelReplica.create(gpus[0], Sequential(*LAYERS), loss=CrossEntropyLoss(),
                                    optimizer=SGD(0.1, momentum=0.9), seed=3)
    for _ in range(3):
        assert float(trainer.step(x, y)) == pytest.approx(reference.train_step(x, y),
                                                          rel=1e-4)
    assert_states_close(trainer.state_dict(), reference.state_dict())
    trainer.stop()


@pytest.mark.parametrize("host", HOSTS)
def test_tensor_parallel_on_two_gpus_matches_the_cpu(system: System, devices: dict[str, Any],
                                                     host: str) -> None:
    x, y = data(3)
    model = Sequential(*LAYERS[:4], Linear(48, 32), Tanh(), Linear(32, 10))
    runs = {}
    for where in (host, "cpu"):
        trainer = TensorParallelTrainer.spawn(system, model, devices[where],
                                              loss=CrossEntropyLoss(label_smoothing=0.1),
                                              optimizer=SGD(0.05, momentum=0.9), seed=5)
        losses = [float(trainer.step(x, y)) for _ in range(4)]
        runs[where] = (losses, trainer.state_dict())
        trainer.stop()
    np.testing.assert_allclose(runs[host][0], runs["cpu"][0], rtol=1e-4)
    assert_states_close(runs[host][1], runs["cpu"][1])


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_parameter_server_on_a_gpu_matches_the_cpu(system: System, devices: dict[str, Any],
                                                   optimizer: str) -> None:
    rng = np.random.default_rng(4)
    initial = rng.standard_normal(1000).astype(np.float32)
    pushes = [(int(rng.integers(0, 3)), rng.standard_normal(1000).astype(np.float32))
              for _ in range(30)]
    results = {}
    for where in ("thread", "cpu"):
        ps = AsyncParameterServer.spawn(system, initial, optimizer, lr=0.01, max_staleness=1,
                                        device=devices[where][0])
        answers: list[int | str] = []
        for lag, gradient in pushes:
            version = ps.stats().version
            try:
                answers.append(ps.push_gradient(0, max(version - lag, 0), gradient))
            except StaleGradient:
                answers.append("stale")
        results[where] = (answers, ps.pull_weights(0)[0], tuple(ps.stats()))
        ps.stop()
    assert results["thread"][0] == results["cpu"][0]
    assert "stale" in results["cpu"][0]
    np.testing.assert_allclose(results["thread"][1], results["cpu"][1], rtol=1e-4, atol=1e-5)
    assert results["thread"][2] == pytest.approx(results["cpu"][2])


def test_workers_on_two_gpus_train_through_the_server(system: System,
                                                      devices: dict[str, Any]) -> None:
    model = Sequential(Linear(8, 32), ReLU(), Linear(32, 4))
    x, y = blobs(1, 900)
    x_test, y_test = blobs(2, 400)
    gpus = devices["thread"]
    ps = AsyncParameterServer.spawn(system, flatten_parameters(model, model.init_parameters(0)),
                                    "adamw", lr=0.01, device=gpus[0])
    workers = [ParameterServerWorker.spawn(system, ps, model, gpus[k % 2],
                                           loss=CrossEntropyLoss(), worker_id=k)
               for k in range(3)]
    done = []

    def work(k: int) -> None:
        done.append(workers[k].train(x[k::3], y[k::3], steps=40, batch_size=32, seed=k))

    pool = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
    assert len(done) == 3
    weights, version = ps.pull_weights(0)
    assert version == sum(r.applied for r in done)
    replica = ModelReplica.create(devices["cpu"][0], model, loss=MSELoss(),
                                  optimizer=SGD(0.0),
                                  parameters=unflatten_parameters(model, weights))
    assert float((replica.predict(x_test).argmax(axis=1) == y_test).mean()) >= 0.95
    for worker in workers:
        worker.stop()
    ps.stop()


def test_parameter_server_survives_a_poisoned_gpu_context(system: System,
                                                          devices: dict[str, Any]) -> None:
    """A real illegal-address fault on the server's GPU (process host) after 40 of 60
    pushes: the state is rebuilt on the new context and matches a CPU server's."""
    rng = np.random.default_rng(8)
    initial = rng.standard_normal(4096).astype(np.float32)
    pushes = [rng.standard_normal(4096).astype(np.float32) for _ in range(60)]
    results = {}
    for where in ("process", "cpu"):
        device = devices[where][1]
        ps = AsyncParameterServer.spawn(system, initial, "adamw", lr=0.01, device=device)
        for k, gradient in enumerate(pushes):
            if k == 40 and where == "process":
                with pytest.raises(ContextPoisoned):
                    device.inject_fault(FaultKind.POISON)
            ps.push_gradient(0, k, gradient)
        results[where] = (ps.pull_weights(0), ps.counters().rebuilds)
        ps.stop()
    (gpu_weights, gpu_version), rebuilds = results["process"]
    (cpu_weights, cpu_version), _ = results["cpu"]
    assert gpu_version == cpu_version == 60 and rebuilds == 1
    np.testing.assert_allclose(gpu_weights, cpu_weights, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("trainer_kind", ["pipeline", "tensor"])
def test_a_poisoned_gpu_mid_training_is_recovered(system: System, devices: dict[str, Any],
                                                  trainer_kind: str) -> None:
    """A real illegal-address fault on GPU 1 (process host) after 20 steps: the trainer
    rebuilds that device's part, replays from its checkpoint and ends as the CPU run."""
    x, y = data(6)
    kwargs: dict[str, Any] = {"loss": CrossEntropyLoss(), "optimizer": SGD(0.05, momentum=0.9),
                              "seed": 2}
    runs = {}
    for where in ("process", "cpu"):
        if trainer_kind == "pipeline":
            trainer: Any = PipelineParallelTrainer.spawn(
                system, [Sequential(*LAYERS[:3]), Sequential(*LAYERS[3:])], devices[where],
                micro_batches=2, **kwargs)
        else:
            trainer = TensorParallelTrainer.spawn(system, Sequential(*LAYERS), devices[where],
                                                  **kwargs)
        losses, recovered = [], []
        for k in range(24):
            if k == 20 and where == "process":
                with pytest.raises(ContextPoisoned):
                    devices[where][1].inject_fault(FaultKind.POISON)
            result = trainer.step(x, y)
            losses.append(float(result))
            recovered.append(result.recovered)
        runs[where] = (losses, recovered, trainer.state_dict())
        trainer.stop()
    assert runs["process"][1] == [int(k == 20) for k in range(24)]
    np.testing.assert_allclose(runs["process"][0], runs["cpu"][0], rtol=1e-4)
    assert_states_close(runs["process"][2], runs["cpu"][2])
