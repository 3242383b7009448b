"""Section 6 of the original package's API (``atomr_accel.solver``): ``Solver``'s names,
argument order and options, computed on the CPU backend against NumPy in float64."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import scipy.linalg

from atomr_accel import Device, GpuRuntimeError, LibraryError, System
from atomr_accel.solver import Solver

SIGNATURES = {
    "lu": "a ipiv m n lda",
    "lu_solve": "lu ipiv b n nrhs ldb trans",
    "cholesky": "a n uplo lda",
    "qr": "a tau m n lda",
    "svd": "a s m n u vt",
    "eigh": "a w n uplo lda compute_vectors",
    "getrf_batched": "a ipiv info batch_count n lda",
    "potrf_batched": "a info batch_count n uplo lda",
    "gesvdj_batched": "a s batch_count m n u v",
}


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("original-solver") as system:
        yield system.spawn_device(mock=True)


@pytest.mark.parametrize("suffix", ["f32", "f64"])
@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_names_signatures_and_time_outs(name: str, suffix: str) -> None:
    method = getattr(Solver, f"{name}_{suffix}")
    params = [p.name for p in inspect.signature(method).parameters.values()
              if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert params[1:] == [*SIGNATURES[name].split(), "timeout_secs"]
    assert inspect.signature(method).parameters["timeout_secs"].default == 60.0


def put(dev: Device, host: np.ndarray) -> Any:
    buf = dev.allocate(host.size, host.dtype)
    dev.copy_from_numpy(buf, host.reshape(-1, order="F"))
    return buf


def get(dev: Device, buf: Any, *shape: int) -> np.ndarray:
    return dev.copy_to_numpy(buf).reshape(shape, order="F")


def spd(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.standard_normal((n, n))
    return m @ m.T + n * np.eye(n)


def test_lu_and_lu_solve(dev: Device) -> None:
    rng = np.random.default_rng(1)
    n = 6
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, 2))
    da, ipiv, db = put(dev, a), dev.allocate_i32(n), put(dev, b)
    dev.solver().lu_f64(da, ipiv, n, n)
    up = scipy.linalg.lu(a)[2]
    lu = get(dev, da, n, n)
    np.testing.assert_allclose(np.triu(lu), up, atol=1e-12)
    dev.solver().lu_solve_f64(da, ipiv, db, n, 2)
    np.testing.assert_allclose(get(dev, db, n, 2), np.linalg.solve(a, b), rtol=1e-10)
    db = put(dev, b)
    dev.solver().lu_solve_f64(da, ipiv, db, n, 2, trans=True)
    np.testing.assert_allclose(get(dev, db, n, 2), np.linalg.solve(a.T, b), rtol=1e-10)


@pytest.mark.parametrize("uplo", ["U", "L", "u", "l"])
def test_cholesky(dev: Device, uplo: str) -> None:
    a = spd(np.random.default_rng(2), 5)
    da = put(dev, a)
    dev.solver().cholesky_f64(da, 5, uplo)
    got = get(dev, da, 5, 5)
    if uplo.upper() == "U":
        np.testing.assert_allclose(np.triu(got), np.linalg.cholesky(a).T, rtol=1e-12)
    else:
        np.testing.assert_allclose(np.tril(got), np.linalg.cholesky(a), rtol=1e-12)


def test_cholesky_default_is_upper_and_bad_uplo_is_refused(dev: Device) -> None:
    a = spd(np.random.default_rng(3), 4)
    da = put(dev, a)
    dev.solver().cholesky_f64(da, 4)
    np.testing.assert_allclose(np.triu(get(dev, da, 4, 4)), np.linalg.cholesky(a).T, rtol=1e-12)
    with pytest.raises(GpuRuntimeError, match="uplo must be one of"):
        dev.solver().cholesky_f64(da, 4, "X")
    with pytest.raises(LibraryError):
        dev.solver().cholesky_f64(put(dev, -np.eye(4)), 4)


def test_qr_svd_eigh(dev: Device) -> None:
    rng = np.random.default_rng(4)
    m, n = 6, 4
    a = rng.standard_normal((m, n))
    da, tau = put(dev, a), dev.allocate_f64(n)
    dev.solver().qr_f64(da, tau, m, n)
    r = np.triu(get(dev, da, m, n))[:n]
    np.testing.assert_allclose(np.abs(r), np.abs(np.linalg.qr(a)[1]), rtol=1e-10, atol=1e-12)
    da, s = put(dev, a), dev.allocate_f64(n)
    u, vt = dev.allocate_f64(m * m), dev.allocate_f64(n * n)
    dev.solver().svd_f64(da, s, m, n, u, vt)
    sv = dev.copy_to_numpy(s)
    np.testing.assert_allclose(sv, np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    uu, vv = get(dev, u, m, m)[:, :n], get(dev, vt, n, n)
    np.testing.assert_allclose(uu @ np.diag(sv) @ vv, a, atol=1e-12)
    sym = spd(rng, 5)
    ds, w = put(dev, sym), dev.allocate_f64(5)
    dev.solver().eigh_f64(ds, w, 5)
    np.testing.assert_allclose(dev.copy_to_numpy(w), np.linalg.eigvalsh(sym), rtol=1e-12)
    ds = put(dev, sym)
    dev.solver().eigh_f64(ds, w, 5, "U", compute_vectors=False)
    np.testing.assert_allclose(dev.copy_to_numpy(w), np.linalg.eigvalsh(sym), rtol=1e-12)


def test_batched_forms_with_info(dev: Device) -> None:
    rng = np.random.default_rng(5)
    n, batch = 4, 3
    mats = [rng.standard_normal((n, n)) for _ in range(batch)]
    mats[1][:, 2] = 0.0  # singular: its status says so, nothing raises
    da = put(dev, np.hstack(mats))
    ipiv, info = dev.allocate_i32(n * batch), dev.allocate_i32(batch)
    dev.solver().getrf_batched_f64(da, ipiv, info, batch, n)
    status = dev.copy_to_numpy(info)
    assert status[0] == 0 and status[2] == 0 and status[1] > 0
    spds = [spd(rng, n) for _ in range(batch)]
    spds[2] = -spds[2]
    dp = put(dev, np.hstack(spds))
    dev.solver().potrf_batched_f64(dp, info, batch, n)
    status = dev.copy_to_numpy(info)
    assert list(status[:2]) == [0, 0] and status[2] > 0
    got = get(dev, dp, n, n * batch)
    np.testing.assert_allclose(np.triu(got[:, :n]), np.linalg.cholesky(spds[0]).T, rtol=1e-12)


def test_gesvdj_batched_beyond_32(dev: Device) -> None:
    rng = np.random.default_rng(6)
    m, n, batch = 40, 33, 2
    a = rng.standard_normal((m, n * batch))
    da, s = put(dev, a), dev.allocate_f64(n * batch)
    u, v = dev.allocate_f64(m * n * batch), dev.allocate_f64(n * n * batch)
    dev.solver().gesvdj_batched_f64(da, s, batch, m, n, u, v)
    sv = dev.copy_to_numpy(s).reshape(batch, n)
    uu, vv = get(dev, u, m, n * batch), get(dev, v, n, n * batch)
    for i in range(batch):
        block = a[:, i * n:(i + 1) * n]
        np.testing.assert_allclose(sv[i], np.linalg.svd(block, compute_uv=False), rtol=1e-10)
        rebuilt = uu[:, i * n:(i + 1) * n] @ np.diag(sv[i]) @ vv[:, i * n:(i + 1) * n].T
        np.testing.assert_allclose(rebuilt, block, atol=1e-10)
