"""The fused trainer step on CUDA: ``GradCheck`` and the gated update kernels against the
CPU backend, and a one-GPU ``DataParallelTrainer`` against a CPU one, a bad batch
included. Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_train_fused_step_gpu.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_train_fused_step import run_op

from atomr_accel import InvalidArgument, System
from atomr_accel.core.ops._train import AdamUpdate, GradCheck, SgdUpdate
from atomr_accel.facade import Device
from atomr_accel.train import SGD, Adam, DataParallelTrainer, Linear, MSELoss, Sequential, Tanh

pytestmark = pytest.mark.gpu

Array = np.ndarray[Any, Any]
TIMEOUT = 60.0
"""Seconds an op may take here (the first of a kind compiles its kernel)."""


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("train-fused-step-gpu") as s:
        yield s


@pytest.fixture(scope="module")
def devices(system: System) -> tuple[Device, Device]:
    return system.spawn_device(mock=True), system.spawn_device(mock=False)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("bad", [None, np.nan, np.inf])
def test_grad_check_on_cuda_matches_the_cpu_backend(devices: tuple[Device, Device],
                                                    dtype: Any, bad: float | None) -> None:
    rng = np.random.default_rng(3)
    arrays = {"g0": rng.standard_normal(70_000).astype(dtype),
              "g1": rng.standard_normal(33).astype(dtype),
              "stats": np.array([4.0, -1.0, -1.0], dtype)}
    if bad is not None:
        arrays["g0"][12_345] = bad
    make = lambda r: GradCheck((r["g0"], r["g1"]), r["stats"])  # noqa: E731
    want, got = (run_op(d, arrays, make, TIMEOUT)["stats"] for d in devices)
    assert got[0] == want[0] and got[2] == want[2] == (1.0 if bad is None else 0.0)
    if bad is None:
        np.testing.assert_allclose(got[1], want[1], rtol=1e-4 if dtype == np.float32 else 1e-12)
    else:
        assert not np.isfinite(got[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", ["sgd", "sgd-momentum", "adam"])
def test_gated_kernels_apply_only_with_the_flag(devices: tuple[Device, Device], dtype: Any,
                                                kind: str) -> None:
    def arrays(flag: float) -> dict[str, Array]:
        rng = np.random.default_rng(5)
        return {"p": rng.standard_normal(5000).astype(dtype),
                "g": rng.standard_normal(5000).astype(dtype),
                "a": rng.standard_normal(5000).astype(dtype),
                "b": rng.uniform(0.1, 1.0, 5000).astype(dtype),
                "stats": np.array([1.0, 1.0, flag], dtype)}

    def make(r: dict[str, Any], gate: Any) -> Any:
        if kind == "sgd":
            return SgdUpdate(r["p"], r["g"], None, 3, 4000, 0.1, weight_decay=0.01, gate=gate)
        if kind == "sgd-momentum":
            return SgdUpdate(r["p"], r["g"], r["a"], 0, 5000, 0.1, 0.9, nesterov=True,
                             gate=gate)
        return AdamUpdate(r["p"], r["g"], r["a"], r["b"], 0, 5000, 1e-2, 4, gate=gate)

    cpu, cuda = devices
    rtol, atol = (1e-5, 1e-6) if dtype == np.float32 else (1e-12, 1e-14)
    want = run_op(cpu, arrays(1.0), lambda r: make(r, None), TIMEOUT)
    opened = run_op(cuda, arrays(1.0), lambda r: make(r, r["stats"]), TIMEOUT)
    closed = run_op(cuda, arrays(0.0), lambda r: make(r, r["stats"]), TIMEOUT)
    start = arrays(0.0)
    for name in ("p", "a", "b"):
        np.testing.assert_allclose(opened[name], want[name], rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_array_equal(closed[name], start[name], err_msg=name)


@pytest.mark.parametrize("optimizer", [SGD(lr=0.1, momentum=0.9), Adam(lr=0.01)],
                         ids=["sgd", "adam"])
def test_one_gpu_trainer_matches_a_cpu_trainer(system: System,
                                               devices: tuple[Device, Device],
                                               optimizer: SGD | Adam) -> None:
    model = Sequential(Linear(6, 16), Tanh(), Linear(16, 3))
    rng = np.random.default_rng(9)
    data = [(rng.standard_normal((12, 6)), rng.standard_normal((12, 3))) for _ in range(4)]
    trainers = [DataParallelTrainer.spawn(system, model, loss=MSELoss(), optimizer=optimizer,
                                          devices=[d], seed=2, dtype="f64", micro_batch=5)
                for d in devices]
    for index, (x, y) in enumerate(data):
        if index == 2:
            bad = x.copy()
            bad[3, 3] = np.nan
            for trainer in trainers:
                before = trainer.state_dict()
                with pytest.raises(InvalidArgument, match="not finite"):
                    trainer.step(bad, y)
                after = trainer.state_dict()
                for key, value in before.items():
                    np.testing.assert_array_equal(after[key], value, err_msg=key)
        want, got = (t.step(x, y) for t in trainers)
        assert float(got) == pytest.approx(float(want), rel=1e-10)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-10)
    want_state, got_state = (t.state_dict() for t in trainers)
    for key, value in want_state.items():
        np.testing.assert_allclose(got_state[key], value, rtol=1e-9, atol=1e-12, err_msg=key)
