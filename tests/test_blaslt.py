"""BlasLt fused matmuls on the CPU backend against float64 NumPy references.

Every epilogue runs through ``dev.blaslt()`` on random data (never zeros) in
f64, f32, f16 and bf16, with and without transposes, against references
written here: the product in float64, the tanh form of GELU spelled out, the
ReLU bit mask packed bit by bit. The backward epilogues are checked against
central finite differences of losses computed with the forward op itself, so
forward and backward agree on what they compute. Bad input is a typed error
and the device keeps serving.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.blaslt import aux_len, gelu_aux_ld, relu_aux_ld

Arr = np.ndarray[Any, Any]
TOL = {DType.F64: 1e-12, DType.F32: 2e-6, DType.F16: 2e-3, DType.BF16: 1.6e-2}
"""Normwise relative error bounds: a few units of each dtype's rounding of the result."""
DTYPES = [DType.F64, DType.F32, DType.F16, DType.BF16]
NO_BF16 = importlib.util.find_spec("ml_dtypes") is None
"""bf16 host arrays need ml_dtypes; where it is missing the bf16 cases are skipped."""
M, N, K = 5, 19, 7  # N not a multiple of 8: the aux rows carry padding
FORWARD = ["none", "bias", "relu", "gelu", "bias_relu", "bias_gelu"]


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("blaslt-cpu") as system:
        yield system.spawn_device(mock=True)


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Standard normal values away from zero, rounded to ``dtype``, held in float64."""
    x = rng.standard_normal(shape)
    x = np.where(np.abs(x) < 0.05, 0.05 + x, x)
    out: Arr = x.astype(dtype.numpy).astype(np.float64)
    return out


def upload(dev: Device, values: Arr, dtype: DType) -> Any:
    flat = np.ascontiguousarray(values).reshape(-1)
    buf = dev.allocate(flat.size, dtype)
    dev.copy_from_numpy(buf, flat.astype(dtype.numpy))
    return buf


def download(dev: Device, buf: Any) -> Arr:
    out: Arr = dev.copy_to_numpy(buf).astype(np.float64)
    return out


def gelu_tanh(x: Arr) -> Arr:
    """GELU's tanh approximation, as PyTorch's ``gelu(approximate="tanh")`` writes it."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def relu_mask_bytes(z: Arr) -> Arr:
    """The cuBLASLt ReLU bit mask of ``z``: per row, bit ``j % 8`` of byte ``j // 8``."""
    rows, cols = z.shape
    out = np.zeros((rows, relu_aux_ld(cols)), dtype=np.int64)
    for i in range(rows):
        for j in range(cols):
            if z[i, j] > 0:
                out[i, j // 8] += 1 << (j % 8)
    return out


def stored(x: Arr, trans: bool) -> Arr:
    """What a buffer holds for the operand ``x``: ``x`` itself, or its transpose."""
    return x.T if trans else x


def error(got: Arr, want: Arr) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def dtypes(*chosen: DType) -> list[Any]:
    """``chosen`` as parameters, bf16 skipped where ml_dtypes is missing."""
    skip = pytest.mark.skipif(NO_BF16, reason="bf16 host arrays need ml_dtypes")
    return [pytest.param(d, marks=skip) if d is DType.BF16 else d for d in chosen]


@pytest.mark.parametrize("dtype", dtypes(*DTYPES), ids=str)
@pytest.mark.parametrize("epilogue", FORWARD)
def test_forward_matches_reference(dev: Device, dtype: DType, epilogue: str) -> None:
    rng = np.random.default_rng(len(epilogue) * 7 + DTYPES.index(dtype))
    trans_a, trans_b = DTYPES.index(dtype) % 2 == 1, DTYPES.index(dtype) >= 2
    a, b = rand(rng, (M, K), dtype), rand(rng, (K, N), dtype)
    c, bias = rand(rng, (M, N), dtype), rand(rng, (N,), dtype)
    alpha, beta = 0.75, 0.5
    z = alpha * a @ b + beta * c + (bias if "bias" in epilogue else 0.0)
    want = {"relu": np.maximum(z, 0.0), "gelu": gelu_tanh(z)}.get(
        epilogue.removeprefix("bias_"), z)
    da, db = upload(dev, stored(a, trans_a), dtype), upload(dev, stored(b, trans_b), dtype)
    dd = upload(dev, c, dtype)
    options: dict[str, Any] = {"alpha": alpha, "beta": beta, "trans_a": trans_a,
                               "trans_b": trans_b}
    if "bias" in epilogue:
        options["bias"] = upload(dev, bias, dtype)
    assert dev.blaslt().matmul(da, db, dd, M, N, K, epilogue, **options) == "numpy"
    assert error(download(dev, dd).reshape(M, N), want) < TOL[dtype]


@pytest.mark.parametrize("dtype", dtypes(DType.F64, DType.BF16), ids=str)
@pytest.mark.parametrize("epilogue", ["relu", "bias_relu", "gelu", "bias_gelu"])
def test_forward_writes_the_aux_layout(dev: Device, dtype: DType, epilogue: str) -> None:
    rng = np.random.default_rng(3)
    a, b, bias = rand(rng, (M, K), dtype), rand(rng, (K, N), dtype), rand(rng, (N,), dtype)
    z = a @ b + (bias if "bias" in epilogue else 0.0)
    relu = "relu" in epilogue
    aux = dev.allocate(aux_len(epilogue, M, N), DType.U8 if relu else dtype)
    dd = dev.allocate(M * N, dtype)
    options: dict[str, Any] = {"aux": aux}
    if "bias" in epilogue:
        options["bias"] = upload(dev, bias, dtype)
    dev.blaslt().matmul(upload(dev, a, dtype), upload(dev, b, dtype), dd, M, N, K, epilogue,
                        **options)
    got = dev.copy_to_numpy(aux)
    if relu:
        assert got.size == M * relu_aux_ld(N) and got.dtype == np.uint8
        np.testing.assert_array_equal(got.reshape(M, -1).astype(np.int64), relu_mask_bytes(z))
    else:
        rows = got.astype(np.float64).reshape(M, gelu_aux_ld(N))[:, :N]
        assert error(rows, z) < TOL[dtype]


# ------------------------------------------------------------- backward epilogues


def forward_loss(dev: Device, x: Arr, w: Arr, bias: Arr, u: Arr, epilogue: str) -> float:
    """``sum(u * epilogue(x @ w + bias))`` with the forward op in float64."""
    d = dev.allocate(x.shape[0] * w.shape[1], DType.F64)
    dev.blaslt().matmul(upload(dev, x, DType.F64), upload(dev, w, DType.F64), d, x.shape[0],
                        w.shape[1], x.shape[1], epilogue, bias=upload(dev, bias, DType.F64))
    return float(np.sum(u * download(dev, d).reshape(u.shape)))


def central(f: Any, x: Arr, index: tuple[int, ...], h: float = 1e-6) -> float:
    """The central difference of ``f`` along one element of ``x``."""
    plus, minus = x.copy(), x.copy()
    plus[index] += h
    minus[index] -= h
    return float((f(plus) - f(minus)) / (2 * h))


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_activation_gradients_match_finite_differences(dev: Device, act: str) -> None:
    """Forward ``H = act(X W + b)`` keeps ``aux``; for ``L = sum(U * H)`` with ``U = U1 @ V``
    the backward ``D = (U1 @ V) * act'(Z)`` is ``dL/dZ``, its column sums ``dL/db``, and
    ``D @ W^T`` is ``dL/dX``."""
    rng = np.random.default_rng(11)
    m, n, k, r = 4, 11, 6, 3
    x, w, bias = rand(rng, (m, k), DType.F64), rand(rng, (k, n), DType.F64), rand(
        rng, (n,), DType.F64)
    u1, v = rand(rng, (m, r), DType.F64), rand(rng, (r, n), DType.F64)
    u = u1 @ v
    blaslt = dev.blaslt()
    aux = dev.allocate(aux_len(act, m, n), DType.U8 if act == "relu" else DType.F64)
    h = dev.allocate(m * n, DType.F64)
    blaslt.matmul(upload(dev, x, DType.F64), upload(dev, w, DType.F64), h, m, n, k,
                  f"bias_{act}", bias=upload(dev, bias, DType.F64), aux=aux)
    dz, db = dev.allocate(m * n, DType.F64), dev.allocate(n, DType.F64)
    assert blaslt.matmul_backward(upload(dev, u1, DType.F64), upload(dev, v, DType.F64), dz,
                                  m, n, r, f"d{act}_bgrad", aux=aux, bias_grad=db) == "numpy"
    dz_only = dev.allocate(m * n, DType.F64)
    blaslt.matmul_backward(upload(dev, u1, DType.F64), upload(dev, v, DType.F64), dz_only,
                           m, n, r, f"d{act}", aux=aux)
    grad_z, grad_b = download(dev, dz).reshape(m, n), download(dev, db)
    np.testing.assert_allclose(download(dev, dz_only).reshape(m, n), grad_z, rtol=1e-14)
    epilogue = f"bias_{act}"
    for j in (0, 5, n - 1):
        fd = central(lambda bb: forward_loss(dev, x, w, bb, u, epilogue), bias, (j,))
        assert grad_b[j] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    grad_x = grad_z @ w.T
    for index in ((0, 0), (2, 3), (m - 1, k - 1)):
        fd = central(lambda xx: forward_loss(dev, xx, w, bias, u, epilogue), x, index)
        assert grad_x[index] == pytest.approx(fd, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("which", ["bgradb", "bgrada"])
def test_bias_gradient_of_a_linear_layer(dev: Device, which: str) -> None:
    """For ``Y = X W + b`` and ``L = sum(G * Y)``: ``bgradb`` computes ``dW = X^T G`` with
    ``dL/db`` (sums of ``op(B) = G`` over k), ``bgrada`` computes ``dW^T = G^T X`` with the same
    ``dL/db`` (sums of ``op(A) = G^T`` over k); both checked by finite differences."""
    rng = np.random.default_rng(5)
    batch, fan_in, fan_out = 6, 4, 9
    x, w = rand(rng, (batch, fan_in), DType.F64), rand(rng, (fan_in, fan_out), DType.F64)
    bias, g = rand(rng, (fan_out,), DType.F64), rand(rng, (batch, fan_out), DType.F64)
    dx, dg = upload(dev, x, DType.F64), upload(dev, g, DType.F64)
    dw, db = dev.allocate(fan_in * fan_out, DType.F64), dev.allocate(fan_out, DType.F64)
    if which == "bgradb":  # D = op(A) @ op(B) = X^T @ G, A stored as X (trans_a)
        dev.blaslt().matmul_backward(dx, dg, dw, fan_in, fan_out, batch, "bgradb",
                                     bias_grad=db, trans_a=True)
        grad_w = download(dev, dw).reshape(fan_in, fan_out)
    else:  # D = G^T @ X, A stored as G (trans_a)
        dev.blaslt().matmul_backward(dg, dx, dw, fan_out, fan_in, batch, "bgrada",
                                     bias_grad=db, trans_a=True)
        grad_w = download(dev, dw).reshape(fan_out, fan_in).T
    grad_b = download(dev, db)
    for j in (0, 4, fan_out - 1):
        fd = central(lambda bb: forward_loss(dev, x, w, bb, g, "bias"), bias, (j,))
        assert grad_b[j] == pytest.approx(fd, rel=1e-6, abs=1e-8)
    for index in ((0, 0), (1, 7), (fan_in - 1, fan_out - 1)):
        fd = central(lambda ww: forward_loss(dev, x, ww, bias, g, "bias"), w, index)
        assert grad_w[index] == pytest.approx(fd, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("dtype", dtypes(DType.F32, DType.BF16), ids=str)
def test_backward_in_low_precision_matches_reference(dev: Device, dtype: DType) -> None:
    rng = np.random.default_rng(8)
    a, b, c = rand(rng, (M, K), dtype), rand(rng, (K, N), dtype), rand(rng, (M, N), dtype)
    z = rand(rng, (M, N), dtype)
    aux = upload(dev, np.pad(z, ((0, 0), (0, gelu_aux_ld(N) - N))), dtype)
    dd, db = upload(dev, c, dtype), dev.allocate(N, dtype)
    dev.blaslt().matmul_backward(upload(dev, a.T, dtype), upload(dev, b, dtype), dd, M, N, K,
                                 "dgelu_bgrad", aux=aux, bias_grad=db, beta=-1.0, trans_a=True)
    t = np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3))
    slope = 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * math.sqrt(2 / math.pi) * (
        1 + 3 * 0.044715 * z * z)
    want = (a @ b - c) * slope
    assert error(download(dev, dd).reshape(M, N), want) < TOL[dtype]
    assert error(download(dev, db), want.sum(axis=0)) < 4 * TOL[dtype]


def test_async_calls_in_flight_together(dev: Device) -> None:
    rng = np.random.default_rng(4)
    a, b, bias = rand(rng, (M, K), DType.F32), rand(rng, (K, N), DType.F32), rand(
        rng, (N,), DType.F32)
    blaslt = dev.blaslt()
    da, db, dbias = (upload(dev, x, DType.F32) for x in (a, b, bias))
    outs = [dev.allocate(M * N, DType.F32) for _ in range(3)]

    async def together() -> list[str]:
        return list(await asyncio.gather(*(blaslt.matmul_async(da, db, d, M, N, K, "bias_gelu",
                                                               bias=dbias) for d in outs)))

    assert asyncio.run(together()) == ["numpy"] * 3
    for d in outs:
        assert error(download(dev, d).reshape(M, N), gelu_tanh(a @ b + bias)) < TOL[DType.F32]


def test_typed_variants_and_is_available(dev: Device) -> None:
    blaslt = dev.blaslt()
    assert blaslt.is_available()
    rng = np.random.default_rng(1)
    a, b = rand(rng, (2, 3), DType.F16), rand(rng, (3, 2), DType.F16)
    d = dev.allocate(4, DType.F16)
    blaslt.matmul_f16(upload(dev, a, DType.F16), upload(dev, b, DType.F16), d, 2, 2, 3)
    assert error(download(dev, d).reshape(2, 2), a @ b) < TOL[DType.F16]
    with pytest.raises(InvalidArgument, match="f16"):
        blaslt.matmul_f16(dev.allocate_f32(6), dev.allocate_f32(6), dev.allocate_f32(4), 2, 2, 3)


def test_bad_input_is_a_typed_error_and_the_device_keeps_serving(dev: Device) -> None:
    blaslt = dev.blaslt()
    f32 = dev.allocate_f32
    a, b, d = f32(M * K), f32(K * N), f32(M * N)
    bad: list[tuple[str, dict[str, Any], str]] = [
        ("none", {"b": f32(K * N - 1)}, "b needs"),
        ("none", {"a": dev.allocate(M * K, DType.F16)}, "a has dtype f16"),
        ("sigmoid", {}, "epilogue must be one of"),
        ("drelu", {}, "epilogue must be one of"),
        ("bias", {}, "needs a bias"),
        ("relu", {"bias": f32(N)}, "takes no bias"),
        ("bias", {"bias": f32(N - 1)}, "bias needs"),
        ("relu", {"aux": f32(aux_len("relu", M, N))}, "u8 bit mask"),
        ("gelu", {"aux": dev.allocate(3, DType.F32)}, "aux needs"),
        ("none", {"a": d}, "must not share"),
    ]
    for epilogue, change, message in bad:
        args = {"a": a, "b": b, "d": d} | {k: v for k, v in change.items() if k in "abd"}
        options = {k: v for k, v in change.items() if k not in "abd"}
        with pytest.raises(InvalidArgument, match=message):
            blaslt.matmul(args["a"], args["b"], args["d"], M, N, K, epilogue, **options)
    aux = dev.allocate(aux_len("relu", M, N), DType.U8)
    backward_bad: list[tuple[str, int, dict[str, Any], str]] = [
        ("drelu", K, {}, "pass aux"),
        ("dgelu", 1, {"aux": f32(aux_len("gelu", M, N))}, "k >= 2"),
        ("drelu_bgrad", K, {"aux": aux}, "pass it"),
        ("bgrada", K, {"bias_grad": f32(M - 1)}, "bias_grad needs 5"),
        ("drelu", K, {"aux": aux, "bias_grad": f32(N)}, "writes no bias_grad"),
        ("bias", K, {}, "epilogue must be one of"),
    ]
    for epilogue, k, options, message in backward_bad:
        with pytest.raises(InvalidArgument, match=message):
            blaslt.matmul_backward(f32(M * k), f32(k * N), d, M, N, k, epilogue, **options)
    rng = np.random.default_rng(2)
    x, y = rand(rng, (M, K), DType.F32), rand(rng, (K, N), DType.F32)
    dev.copy_from_numpy(a, x.astype(np.float32).reshape(-1))
    dev.copy_from_numpy(b, y.astype(np.float32).reshape(-1))
    assert blaslt.matmul(a, b, d, M, N, K, "relu") == "numpy"
    assert error(download(dev, d).reshape(M, N), np.maximum(x @ y, 0)) < TOL[DType.F32]
