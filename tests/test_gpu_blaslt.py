"""BlasLt on CUDA (nvmath-python) against the CPU backend in float64 and against PyTorch.

Each case runs on a CUDA device in f32, f16 or bf16 and on the CPU backend in
float64 on the same (rounded) inputs; the check is the normwise relative
error of each output. Tolerances: the result's own rounding dominates in
f16 (2^-11) and bf16 (2^-8), so 2e-3 and 1.6e-2; f32 accumulates over at most
a hundred products, 2e-5 (1e-4 where cuBLASLt's GELU, with its own tanh,
enters). Where PyTorch imports, ``addmm`` followed by ``relu`` or
``gelu(approximate="tanh")`` on the GPU is a second, independent oracle.
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``. The
measured errors go to ``$BLASLT_ERRORS`` (a JSON path) when it is set.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, InvalidArgument, System
from atomr_accel.blaslt import aux_len, gelu_aux_ld, relu_aux_ld

pytestmark = pytest.mark.gpu

Arr = np.ndarray[Any, Any]
LOW = [DType.F32, DType.F16, DType.BF16]
TOL = {DType.F32: 2e-5, DType.F16: 2e-3, DType.BF16: 1.6e-2}
GELU_F32_TOL = 1e-4
M, N, K = 96, 136, 72  # ReLU rows of 17 bytes padded to 32, GELU rows of 136
FORWARD = ["none", "bias", "relu", "gelu", "bias_relu", "bias_gelu"]
BACKWARD = ["drelu", "dgelu", "drelu_bgrad", "dgelu_bgrad", "bgrada", "bgradb"]
ERRORS: dict[str, float] = {}


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[Device, Device]]:
    with System.open("blaslt-gpu") as system:
        yield system.spawn_device(mock=False), system.spawn_device(mock=True)
    path = os.environ.get("BLASLT_ERRORS")
    if path:
        with open(path, "w") as out:
            json.dump(ERRORS, out, indent=1, sort_keys=True)


def tol(dtype: DType, epilogue: str) -> float:
    return GELU_F32_TOL if dtype is DType.F32 and "gelu" in epilogue else TOL[dtype]


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Arr:
    """Standard normal values rounded to ``dtype``, held in float64."""
    out: Arr = rng.standard_normal(shape).astype(dtype.numpy).astype(np.float64)
    return out


def upload(dev: Device, values: Arr, dtype: DType) -> Any:
    flat = np.ascontiguousarray(values).reshape(-1)
    buf = dev.allocate(flat.size, dtype)
    dev.copy_from_numpy(buf, flat.astype(dtype.numpy))
    return buf


def download(dev: Device, buf: Any) -> Arr:
    out: Arr = dev.copy_to_numpy(buf).astype(np.float64)
    return out


def error(name: str, got: Arr, want: Arr) -> float:
    e = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    ERRORS[name] = e
    return e


def forward(dev: Device, dtype: DType, data: dict[str, Arr], epilogue: str, with_aux: bool,
            **options: Any) -> tuple[str, Arr, Arr | None]:
    """Run a forward matmul on ``dev`` in ``dtype``; answer (what ran, D, raw aux)."""
    m, k = data["a"].shape
    n = data["b"].shape[1]
    ta, tb = options.get("trans_a", False), options.get("trans_b", False)
    a = upload(dev, data["a"].T if ta else data["a"], dtype)
    b = upload(dev, data["b"].T if tb else data["b"], dtype)
    d = upload(dev, data["c"], dtype)
    if "bias" in epilogue:
        options["bias"] = upload(dev, data["bias"], dtype)
    aux = None
    if with_aux:
        aux = dev.allocate(aux_len(epilogue, m, n), DType.U8 if "relu" in epilogue else dtype)
        options["aux"] = aux
    ran = dev.blaslt().matmul(a, b, d, m, n, k, epilogue, **options)
    return ran, download(dev, d).reshape(m, n), None if aux is None else dev.copy_to_numpy(aux)


def data_for(seed: int, dtype: DType, m: int = M, n: int = N, k: int = K) -> dict[str, Arr]:
    rng = np.random.default_rng(seed)
    return {"a": rand(rng, (m, k), dtype), "b": rand(rng, (k, n), dtype),
            "c": rand(rng, (m, n), dtype), "bias": rand(rng, (n,), dtype)}


def test_is_available_on_cuda(devices: tuple[Device, Device]) -> None:
    assert devices[0].blaslt().is_available()


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("epilogue", FORWARD)
def test_forward_matches_cpu_float64(devices: tuple[Device, Device], dtype: DType,
                                     epilogue: str) -> None:
    cuda, cpu = devices
    data = data_for(FORWARD.index(epilogue), dtype)
    trans = FORWARD.index(epilogue) % 2 == 1
    options = {"alpha": 0.5, "beta": 0.25, "trans_a": trans, "trans_b": not trans}
    ran, got, _ = forward(cuda, dtype, data, epilogue, False, **options)
    assert ran == "nvmath"
    _, want, _ = forward(cpu, DType.F64, data, epilogue, False, **options)
    assert error(f"forward {epilogue} {dtype}", got, want) < tol(dtype, epilogue)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("epilogue", ["relu", "gelu", "bias_relu", "bias_gelu"])
def test_forward_aux_matches_cpu(devices: tuple[Device, Device], dtype: DType,
                                 epilogue: str) -> None:
    cuda, cpu = devices
    data = data_for(40 + FORWARD.index(epilogue), dtype)
    _, got, got_aux = forward(cuda, dtype, data, epilogue, True)
    _, want, want_aux = forward(cpu, DType.F64, data, epilogue, True)
    assert got_aux is not None and want_aux is not None
    assert error(f"forward+aux {epilogue} {dtype}", got, want) < tol(dtype, epilogue)
    if "relu" in epilogue:
        ld = relu_aux_ld(N)
        bits_got = np.unpackbits(got_aux.reshape(M, ld), axis=1, count=N, bitorder="little")
        bits_want = np.unpackbits(want_aux.reshape(M, ld), axis=1, count=N, bitorder="little")
        differ = float(np.mean(bits_got != bits_want))
        ERRORS[f"relu mask differing bits {epilogue} {dtype}"] = differ
        assert differ < 0.005  # only where Z rounds across zero
    else:
        ld = gelu_aux_ld(N)
        z_got = got_aux.astype(np.float64).reshape(M, ld)[:, :N]
        z_want = want_aux.reshape(M, ld)[:, :N]
        assert error(f"gelu aux {epilogue} {dtype}", z_got, z_want) < TOL[dtype]


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("epilogue", BACKWARD)
def test_backward_matches_cpu_float64(devices: tuple[Device, Device], dtype: DType,
                                      epilogue: str) -> None:
    """Both backends read the same aux (made here) and the same inputs."""
    cuda, cpu = devices
    rng = np.random.default_rng(70 + BACKWARD.index(epilogue))
    data = data_for(80 + BACKWARD.index(epilogue), dtype)
    z = rand(rng, (M, N), dtype)
    trans = BACKWARD.index(epilogue) % 2 == 0
    results = []
    for dev, dt in ((cuda, dtype), (cpu, DType.F64)):
        a = upload(dev, data["a"].T if trans else data["a"], dt)
        b = upload(dev, data["b"], dt)
        d = upload(dev, data["c"], dt)
        options: dict[str, Any] = {"trans_a": trans, "alpha": 1.5, "beta": 0.5}
        if "relu" in epilogue:
            mask = np.zeros((M, relu_aux_ld(N)), dtype=np.uint8)
            mask[:, : -(-N // 8)] = np.packbits(z > 0, axis=1, bitorder="little")
            options["aux"] = upload(dev, mask, DType.U8)
        elif "gelu" in epilogue:
            options["aux"] = upload(dev, np.pad(z, ((0, 0), (0, gelu_aux_ld(N) - N))), dt)
        grad = None
        if "bgrad" in epilogue:
            grad = dev.allocate(M if epilogue == "bgrada" else N, dt)
            options["bias_grad"] = grad
        ran = dev.blaslt().matmul_backward(a, b, d, M, N, K, epilogue, **options)
        results.append((ran, download(dev, d).reshape(M, N),
                        None if grad is None else download(dev, grad)))
    (ran, got, got_grad), (_, want, want_grad) = results
    assert ran == "nvmath"
    assert error(f"backward {epilogue} {dtype}", got, want) < tol(dtype, epilogue)
    if got_grad is not None and want_grad is not None:
        assert error(f"bias_grad {epilogue} {dtype}", got_grad, want_grad) < 4 * tol(
            dtype, epilogue)


def test_gelu_is_the_tanh_form(devices: tuple[Device, Device]) -> None:
    """cuBLASLt's GELU against both forms in f32: closer to tanh than to erf."""
    cuda, _ = devices
    data = data_for(5, DType.F32)
    data["a"] *= 0.3  # Z mostly in [-3, 3], where the two forms differ most
    _, got, _ = forward(cuda, DType.F32, data, "gelu", False)
    z = data["a"] @ data["b"]
    tanh_form = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    erf_form = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
    to_tanh, to_erf = error("gelu vs tanh form f32", got, tanh_form), error(
        "gelu vs erf form f32", got, erf_form)
    assert to_tanh < GELU_F32_TOL
    assert to_tanh < to_erf / 3


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("epilogue", ["bias", "bias_relu", "bias_gelu"])
def test_forward_matches_torch(devices: tuple[Device, Device], dtype: DType,
                               epilogue: str) -> None:
    torch = pytest.importorskip("torch")
    cuda, _ = devices
    data = data_for(90 + FORWARD.index(epilogue), dtype)
    _, got, _ = forward(cuda, dtype, data, epilogue, False)
    tdtype = {DType.F32: torch.float32, DType.F16: torch.float16,
              DType.BF16: torch.bfloat16}[dtype]

    def tensor(x: Arr) -> Any:
        return torch.tensor(x, dtype=torch.float64, device="cuda").to(tdtype)

    out = torch.addmm(tensor(data["bias"]), tensor(data["a"]), tensor(data["b"]))
    if epilogue == "bias_relu":
        out = torch.nn.functional.relu(out)
    elif epilogue == "bias_gelu":
        out = torch.nn.functional.gelu(out, approximate="tanh")
    want = out.double().cpu().numpy()
    assert error(f"torch {epilogue} {dtype}", got, want) < 2 * tol(dtype, epilogue)


def test_beta_zero_never_reads_d_and_beta_reads_c(devices: tuple[Device, Device]) -> None:
    cuda, _ = devices
    data = data_for(7, DType.F32)
    nan = dict(data, c=np.full((M, N), np.nan))
    _, got, _ = forward(cuda, DType.F32, nan, "bias_relu", False)
    assert np.isfinite(got).all()
    _, got, _ = forward(cuda, DType.F32, data, "bias", False, beta=-2.0)
    want = data["a"] @ data["b"] - 2.0 * data["c"] + data["bias"]
    assert error("beta -2 f32", got, want) < TOL[DType.F32]


def test_tf32_runs_at_tf32_precision(devices: tuple[Device, Device]) -> None:
    cuda, _ = devices
    data = data_for(9, DType.F32)
    _, got, _ = forward(cuda, DType.F32, data, "bias", False, allow_tf32=True)
    want = data["a"] @ data["b"] + data["bias"]
    assert error("tf32 bias f32", got, want) < 5e-3


def test_a_cached_plan_serves_new_buffers(devices: tuple[Device, Device]) -> None:
    """The same shape and epilogue on fresh buffers reuses the plan with new operands."""
    cuda, _ = devices
    for seed in range(3):
        data = data_for(100 + seed, DType.BF16)
        _, got, _ = forward(cuda, DType.BF16, data, "bias_gelu", False)
        z = data["a"] @ data["b"] + data["bias"]
        want = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
        assert error(f"reuse {seed} bf16", got, want) < TOL[DType.BF16]


def test_async_calls_in_flight_together(devices: tuple[Device, Device]) -> None:
    """``matmul_async`` from a user's own loop: the ops run on threads other than the
    blocking caller's (cuda.core must be ready in each)."""
    cuda, _ = devices
    data = data_for(13, DType.BF16)
    blaslt = cuda.blaslt()
    a, b = upload(cuda, data["a"], DType.BF16), upload(cuda, data["b"], DType.BF16)
    bias = upload(cuda, data["bias"], DType.BF16)
    outs = [cuda.allocate(M * N, DType.BF16) for _ in range(4)]

    async def together() -> list[str]:
        return list(await asyncio.gather(*(blaslt.matmul_async(a, b, d, M, N, K, "bias_relu",
                                                               bias=bias) for d in outs)))

    assert asyncio.run(together()) == ["nvmath"] * 4
    want = np.maximum(data["a"] @ data["b"] + data["bias"], 0)
    for i, d in enumerate(outs):
        got = download(cuda, d).reshape(M, N)
        assert error(f"async {i} bf16", got, want) < TOL[DType.BF16]


def test_odd_shapes(devices: tuple[Device, Device]) -> None:
    cuda, cpu = devices
    data = data_for(11, DType.F32, m=33, n=203, k=37)
    _, got, _ = forward(cuda, DType.F32, data, "bias_gelu", False, trans_b=True)
    _, want, _ = forward(cpu, DType.F64, data, "bias_gelu", False, trans_b=True)
    assert error("odd shape bias_gelu f32", got, want) < GELU_F32_TOL


def test_bad_input_on_cuda_is_typed_and_the_device_serves(devices: tuple[Device, Device]) -> None:
    cuda, _ = devices
    blaslt = cuda.blaslt()
    a, b, d = cuda.allocate_f32(M * K), cuda.allocate_f32(K * N), cuda.allocate_f32(M * N)
    with pytest.raises(InvalidArgument):
        blaslt.matmul(a, b, d, M, N, K + 1)
    with pytest.raises(InvalidArgument):
        blaslt.matmul(a, cuda.allocate(K * N, DType.F16), d, M, N, K)
    with pytest.raises(InvalidArgument):
        blaslt.matmul(a, b, d, M, N, K, "swish")
    data = data_for(12, DType.F32)
    _, got, _ = forward(cuda, DType.F32, data, "relu", False)
    assert error("after bad input", got, np.maximum(data["a"] @ data["b"], 0)) < TOL[DType.F32]


@pytest.mark.parametrize("dtype", [DType.F32, DType.BF16], ids=str)
@pytest.mark.parametrize("epilogue", ["bgrada", "bgradb", "drelu_bgrad"])
@pytest.mark.parametrize("trans", [(False, False), (False, True), (True, True)], ids=str)
def test_backward_transposes_match_cpu(devices: tuple[Device, Device], epilogue: str,
                                       trans: tuple[bool, bool], dtype: DType) -> None:
    """Every storage of A and B under the bias-gradient epilogues (cuBLASLt's BGRADB takes
    its B transposed; where it has no algorithm the gradient is summed apart)."""
    trans_a, trans_b = trans
    data = data_for(120 + BACKWARD.index(epilogue), dtype)
    z = rand(np.random.default_rng(121), (M, N), dtype)
    results = []
    for dev, dt in zip(devices, (dtype, DType.F64), strict=True):
        a = upload(dev, data["a"].T if trans_a else data["a"], dt)
        b = upload(dev, data["b"].T if trans_b else data["b"], dt)
        d = upload(dev, data["c"], dt)
        options: dict[str, Any] = {"trans_a": trans_a, "trans_b": trans_b, "beta": 0.5}
        if epilogue == "drelu_bgrad":
            mask = np.zeros((M, relu_aux_ld(N)), dtype=np.uint8)
            mask[:, : -(-N // 8)] = np.packbits(z > 0, axis=1, bitorder="little")
            options["aux"] = upload(dev, mask, DType.U8)
        grad = dev.allocate(M if epilogue == "bgrada" else N, dt)
        ran = dev.blaslt().matmul_backward(a, b, d, M, N, K, epilogue, bias_grad=grad,
                                           **options)
        results.append((ran, download(dev, d).reshape(M, N), download(dev, grad)))
    (ran, got, got_grad), (_, want, want_grad) = results
    assert ran == "nvmath"
    name = f"{epilogue} trans_a={trans_a} trans_b={trans_b} {dtype}"
    assert error(f"backward {name}", got, want) < TOL[dtype]
    assert error(f"bias_grad {name}", got_grad, want_grad) < 4 * TOL[dtype]


@pytest.mark.parametrize("epilogue", ["bias_relu", "bias_gelu"])
def test_forward_aux_with_transposes_matches_cpu(devices: tuple[Device, Device],
                                                 epilogue: str) -> None:
    """The aux layout does not depend on how A and B are stored."""
    cuda, cpu = devices
    data = data_for(130 + FORWARD.index(epilogue), DType.F32)
    options = {"trans_a": True, "trans_b": True, "alpha": 0.75}
    _, got, got_aux = forward(cuda, DType.F32, data, epilogue, True, **options)
    _, want, want_aux = forward(cpu, DType.F64, data, epilogue, True, **options)
    assert got_aux is not None and want_aux is not None
    assert error(f"forward+aux transposed {epilogue} f32", got, want) < tol(DType.F32, epilogue)
    if "relu" in epilogue:
        ld = relu_aux_ld(N)
        bits_got = np.unpackbits(got_aux.reshape(M, ld), axis=1, count=N, bitorder="little")
        bits_want = np.unpackbits(want_aux.reshape(M, ld), axis=1, count=N, bitorder="little")
        assert float(np.mean(bits_got != bits_want)) < 0.005
    else:
        ld = gelu_aux_ld(N)
        z_got = got_aux.astype(np.float64).reshape(M, ld)[:, :N]
        z_want = want_aux.reshape(M, ld)[:, :N]
        assert error(f"gelu aux transposed {epilogue} f32", z_got, z_want) < TOL[DType.F32]


def test_one_plan_follows_new_scalars_and_buffers(devices: tuple[Device, Device]) -> None:
    """Calls of one shape and epilogue that change alpha, beta, the bias and the aux buffer
    between them each see their own (a cached plan re-pointed, never stale)."""
    cuda, _ = devices
    data = data_for(140, DType.F32)
    a, b = upload(cuda, data["a"], DType.F32), upload(cuda, data["b"], DType.F32)
    product = data["a"] @ data["b"]
    blaslt = cuda.blaslt()
    for i, (alpha, beta) in enumerate([(1.0, 0.0), (0.5, 0.25), (0.5, 0.25), (-2.0, 1.0),
                                       (1.0, 0.0)]):
        bias_values = data["bias"] * (i + 1)
        bias = upload(cuda, bias_values, DType.F32)
        d = upload(cuda, data["c"], DType.F32)
        aux = cuda.allocate(aux_len("bias_gelu", M, N), DType.F32)
        blaslt.matmul(a, b, d, M, N, K, "bias_gelu", bias=bias, aux=aux, alpha=alpha,
                      beta=beta)
        z = alpha * product + beta * data["c"] + bias_values
        gelu = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
        got = download(cuda, d).reshape(M, N)
        assert error(f"plan reuse {i} f32", got, gelu) < GELU_F32_TOL
        z_got = download(cuda, aux).reshape(M, gelu_aux_ld(N))[:, :N]
        assert error(f"plan reuse aux {i} f32", z_got, z) < TOL[DType.F32]
