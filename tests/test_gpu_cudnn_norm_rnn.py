"""cuDNN normalizations and RNNs on CUDA against the CPU backend in f64 and against PyTorch.

Every case runs on a real CUDA device in its own precision and on the CPU
backend with the same values widened to f64; the check is the normwise
relative error of each output. Where PyTorch imports, its own ops
(``F.batch_norm``, ``F.layer_norm``, ``F.group_norm``, ``F.instance_norm``,
``F.rms_norm``, ``nn.LSTM``/``nn.GRU``/``nn.RNN`` with our packed weights
loaded, autograd for the backward) are a second, independent oracle. Run on
a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu``; skipped elsewhere.

Tolerances (normwise): f32 2e-5 (reductions over at most a few thousand
values); f16 5e-3 and bf16 3e-2 (a few units of their rounding, 2**-11 and
2**-8); f64 1e-10.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import Device, DType, RnnBwdInputs, System
from atomr_accel.cudnn import rnn_weight_count

pytestmark = pytest.mark.gpu

Arr = np.ndarray[Any, Any]
TOL = {DType.F32: 2e-5, DType.F16: 5e-3, DType.BF16: 3e-2, DType.F64: 1e-10}
PATHS: dict[str, set[str]] = {}
"""The path each op ran on CUDA (printed by the last test)."""


@pytest.fixture(scope="module")
def devs() -> Iterator[tuple[Device, Device]]:
    with System.open("gpu-cudnn-norm-rnn") as system:
        gpu = system.spawn_device(mock=False)
        assert gpu.backend == "cuda"
        yield gpu, system.spawn_device(mock=True)


def rel(got: Arr, want: Arr) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def put(dev: Device, a: Arr, dtype: DType) -> Any:
    buf = dev.allocate(a.size, dtype)
    dev.copy_from_numpy(buf, np.ascontiguousarray(a).ravel().astype(dtype.numpy))
    return buf


def get(dev: Device, buf: Any, shape: tuple[int, ...]) -> Arr:
    n = int(np.prod(shape))
    return dev.copy_to_numpy(buf)[:n].astype(np.float64).reshape(shape)


def param(dtype: DType) -> DType:
    return DType.F64 if dtype is DType.F64 else DType.F32


def torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False  # full f32, as our gemms run
    torch.backends.cudnn.allow_tf32 = False
    return torch


# ------------------------------------------------------------------- norms


NORMS = [  # name, dims, extra
    ("batch_norm", (8, 16, 12, 10), {}),
    ("layer_norm", (64, 256), {"norm_axes": 1}),
    ("instance_norm", (4, 8, 96), {}),
    ("group_norm", (4, 16, 7, 9), {"groups": 4}),
    ("rms_norm", (64, 512), {"norm_axes": 1}),
]


def _run_norm(dev: Device, name: str, dims: tuple[int, ...], extra: dict[str, Any],
              data: dict[str, Arr], dtype: DType) -> tuple[str, dict[str, Arr]]:
    """Run ``name`` on ``dev`` with ``data`` as ``dtype``; answer (path, outputs)."""
    p = param(dtype)
    c = dims[1]
    k = int(np.prod(dims[len(dims) - extra.get("norm_axes", 1):]))
    stats = {"batch_norm": c, "layer_norm": int(np.prod(dims)) // k,
             "instance_norm": dims[0] * c, "group_norm": dims[0] * extra.get("groups", 1),
             "rms_norm": int(np.prod(dims)) // k}[name]
    x = put(dev, data["x"], dtype)
    y = dev.allocate(data["x"].size, dtype)
    scale = put(dev, data["scale"], p)
    sm, sv = dev.allocate(stats, p), dev.allocate(stats, p)
    cudnn = dev.cudnn()
    out: dict[str, Arr] = {}
    if name == "batch_norm":
        rm, rv = put(dev, data["rm"], p), put(dev, data["rv"], p)
        path = cudnn.batch_norm(x, y, scale, put(dev, data["bias"], p), dims, rm, rv, sm, sv,
                                "train", 1e-5, 0.1)
        out["running_mean"], out["running_var"] = get(dev, rm, (c,)), get(dev, rv, (c,))
    elif name == "rms_norm":
        path = cudnn.rms_norm(x, y, scale, dims, 1, sv, bias=put(dev, data["bias"], p))
    elif name == "layer_norm":
        path = cudnn.layer_norm(x, y, scale, put(dev, data["bias"], p), dims, 1, sm, sv)
    elif name == "group_norm":
        path = cudnn.group_norm(x, y, scale, put(dev, data["bias"], p), dims, extra["groups"],
                                sm, sv)
    else:
        path = cudnn.instance_norm(x, y, scale, put(dev, data["bias"], p), dims, sm, sv)
    out["y"] = get(dev, y, dims)
    out["saved_var"] = get(dev, sv, (stats,))
    if name != "rms_norm":
        out["saved_mean"] = get(dev, sm, (stats,))
    mode = name.removesuffix("_norm")
    dx, ds, db = dev.allocate(data["x"].size, dtype), dev.allocate(k if mode in (
        "layer", "rms") else c, p), dev.allocate(k if mode in ("layer", "rms") else c, p)
    bwd_path = cudnn.norm_bwd(x, put(dev, data["dy"], dtype), scale,
                              None if mode == "rms" else sm, sv, dx, ds, db, dims, mode,
                              norm_axes=extra.get("norm_axes", 1),
                              groups=extra.get("groups", 1))
    out["dx"] = get(dev, dx, dims)
    out["dscale"] = get(dev, ds, (len(ds),))
    out["dbias"] = get(dev, db, (len(db),))
    return f"{path}/{bwd_path}", out


def _norm_data(name: str, dims: tuple[int, ...], extra: dict[str, Any],
               seed: int) -> dict[str, Arr]:
    rng = np.random.default_rng(seed)
    n_params = dims[1] if name in ("batch_norm", "instance_norm", "group_norm") else \
        int(np.prod(dims[len(dims) - extra.get("norm_axes", 1):]))
    return {"x": rng.standard_normal(dims) * 2 + 0.5, "dy": rng.standard_normal(dims),
            "scale": rng.standard_normal(n_params), "bias": rng.standard_normal(n_params),
            "rm": rng.standard_normal(dims[1]), "rv": rng.random(dims[1]) + 0.5}


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16, DType.F64],
                         ids=lambda d: d.value)
@pytest.mark.parametrize(("name", "dims", "extra"), NORMS, ids=[n[0] for n in NORMS])
def test_norms_match_the_cpu_backend(devs: tuple[Device, Device], name: str,
                                     dims: tuple[int, ...], extra: dict[str, Any],
                                     dtype: DType) -> None:
    if dtype is DType.BF16:
        pytest.importorskip("ml_dtypes")
    gpu, cpu = devs
    data = _norm_data(name, dims, extra, 1)
    data["x"] = data["x"].astype(dtype.numpy).astype(np.float64)  # the values both see
    data["dy"] = data["dy"].astype(dtype.numpy).astype(np.float64)
    path, got = _run_norm(gpu, name, dims, extra, data, dtype)
    PATHS.setdefault(f"{name} {dtype.value}", set()).add(path)
    _, want = _run_norm(cpu, name, dims, extra, data, DType.F64)
    # a half-precision y is rounded once more than the f64 reference
    for key, value in want.items():
        assert rel(got[key], value) <= TOL[dtype], (key, rel(got[key], value), path)


def test_norms_match_pytorch(devs: tuple[Device, Device]) -> None:
    torch = torch_or_none()
    if torch is None:
        pytest.skip("PyTorch with CUDA is not available")
    from torch.nn import functional

    gpu, _ = devs
    for name, dims, extra in NORMS:
        data = _norm_data(name, dims, extra, 2)
        _, got = _run_norm(gpu, name, dims, extra, data, DType.F32)
        t = {k: torch.tensor(v, dtype=torch.float32, device="cuda") for k, v in data.items()}
        x = t["x"].clone().requires_grad_(True)
        w = t["scale"].clone().requires_grad_(True)
        b = t["bias"].clone().requires_grad_(True)
        rm, rv = t["rm"].clone(), t["rv"].clone()
        if name == "batch_norm":
            y = functional.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
        elif name == "layer_norm":
            y = functional.layer_norm(x, dims[-1:], w, b, eps=1e-5)
        elif name == "instance_norm":
            y = functional.instance_norm(x, weight=w, bias=b, eps=1e-5)
        elif name == "group_norm":
            y = functional.group_norm(x, extra["groups"], w, b, eps=1e-5)
        else:
            if not hasattr(functional, "rms_norm"):
                continue
            y = functional.rms_norm(x, dims[-1:], w, eps=1e-5) + b
        y.backward(t["dy"])
        checks = {"y": y, "dx": x.grad, "dscale": w.grad, "dbias": b.grad}
        if name == "batch_norm":
            checks.update(running_mean=rm, running_var=rv)
        for key, value in checks.items():
            want = value.detach().double().cpu().numpy()
            assert rel(got[key].reshape(want.shape), want) <= 1e-4, (name, key)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16], ids=lambda d: d.value)
def test_batch_norm_inference(devs: tuple[Device, Device], dtype: DType) -> None:
    """Inference (running statistics) against the CPU backend and ``F.batch_norm``."""
    gpu, cpu = devs
    dims = (8, 16, 12, 10)
    data = _norm_data("batch_norm", dims, {}, 5)
    data["x"] = data["x"].astype(dtype.numpy).astype(np.float64)
    results = {}
    for dev, dt in ((gpu, dtype), (cpu, DType.F64)):
        p = param(dt)
        y = dev.allocate(data["x"].size, dt)
        path = dev.cudnn().batch_norm(put(dev, data["x"], dt), y, put(dev, data["scale"], p),
                                      put(dev, data["bias"], p), dims, put(dev, data["rm"], p),
                                      put(dev, data["rv"], p), phase="eval")
        results[dev.backend] = get(dev, y, dims)
        PATHS.setdefault(f"batch_norm inference {dt.value} on {dev.backend}", set()).add(path)
    assert rel(results["cuda"], results["cpu"]) <= TOL[dtype]
    torch = torch_or_none()
    if torch is not None:
        from torch.nn import functional

        t = {k: torch.tensor(v, dtype=torch.float64, device="cuda") for k, v in data.items()}
        want = functional.batch_norm(t["x"], t["rm"], t["rv"], t["scale"], t["bias"],
                                     training=False, eps=1e-5)
        assert rel(results["cuda"], want.cpu().numpy()) <= TOL[dtype]


# -------------------------------------------------------------------- RNNs


RNNS = [("lstm", "uni", 1), ("lstm", "bi", 2), ("gru", "bi", 2), ("rnn_tanh", "uni", 2),
        ("rnn_relu", "bi", 1)]
T, B, IN, H = 12, 8, 16, 32


def _rnn_data(mode: str, direction: str, layers: int, seed: int) -> dict[str, Arr]:
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bi" else 1
    state = (layers * dirs, B, H)
    return {"x": rng.standard_normal((T, B, IN)),
            "w": rng.uniform(-1, 1, rnn_weight_count(mode, direction, layers, IN, H)) / H**0.5,
            "h0": rng.standard_normal(state) * 0.5, "c0": rng.standard_normal(state) * 0.5,
            "dy": rng.standard_normal((T, B, dirs * H)), "dh": rng.standard_normal(state),
            "dc": rng.standard_normal(state)}


def _run_rnn(dev: Device, mode: str, direction: str, layers: int, data: dict[str, Arr],
             dtype: DType) -> tuple[str, dict[str, Arr]]:
    lstm = mode == "lstm"
    dirs = 2 if direction == "bi" else 1
    b = {k: put(dev, v, dtype) for k, v in data.items()}
    y = dev.allocate(T * B * dirs * H, dtype)
    h_out, c_out = dev.allocate(data["h0"].size, dtype), dev.allocate(data["h0"].size, dtype)
    cudnn = dev.cudnn()
    sizes = {"num_layers": layers, "input_size": IN, "hidden_size": H, "seq_length": T,
             "batch_size": B}
    path = cudnn.rnn_fwd(b["x"], b["h0"], b["w"], y, h_out, b["c0"] if lstm else None,
                         c_out if lstm else None, mode, direction, **sizes)
    dx, dw = dev.allocate(data["x"].size, dtype), dev.allocate(data["w"].size, dtype)
    dh, dc = dev.allocate(data["h0"].size, dtype), dev.allocate(data["h0"].size, dtype)
    inputs = (RnnBwdInputs().set_x(b["x"]).set_weights(b["w"]).set_h_in(b["h0"])
              .set_dy(b["dy"]).set_dh_out(b["dh"]).set_dx(dx).set_dweights(dw).set_dh_in(dh)
              .set_mode(mode).set_direction(direction).set_num_layers(layers)
              .set_input_size(IN).set_hidden_size(H).set_seq_length(T).set_batch_size(B))
    if lstm:
        inputs.set_c_in(b["c0"]).set_dc_out(b["dc"]).set_dc_in(dc)
    bwd = cudnn.rnn_bwd_f32(inputs) if dtype is DType.F32 else cudnn.rnn_bwd(inputs)
    state = data["h0"].shape
    out = {"y": get(dev, y, (T, B, dirs * H)), "h_out": get(dev, h_out, state),
           "dx": get(dev, dx, (T, B, IN)), "dw": get(dev, dw, data["w"].shape),
           "dh": get(dev, dh, state)}
    if lstm:
        out["c_out"], out["dc"] = get(dev, c_out, state), get(dev, dc, state)
    return f"{path}/{bwd}", out


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64], ids=lambda d: d.value)
@pytest.mark.parametrize(("mode", "direction", "layers"), RNNS,
                         ids=["-".join(map(str, r)) for r in RNNS])
def test_rnns_match_the_cpu_backend(devs: tuple[Device, Device], mode: str, direction: str,
                                    layers: int, dtype: DType) -> None:
    gpu, cpu = devs
    data = {k: v.astype(dtype.numpy).astype(np.float64)
            for k, v in _rnn_data(mode, direction, layers, 3).items()}
    path, got = _run_rnn(gpu, mode, direction, layers, data, dtype)
    PATHS.setdefault(f"rnn {mode} {direction} x{layers} {dtype.value}", set()).add(path)
    assert path == "composed/composed"
    _, want = _run_rnn(cpu, mode, direction, layers, data, DType.F64)
    tol = 1e-4 if dtype is DType.F32 else 1e-10  # gradients through T steps and 2 layers
    for key, value in want.items():
        assert rel(got[key], value) <= tol, (key, rel(got[key], value))


@pytest.mark.parametrize(("mode", "direction", "layers"), RNNS,
                         ids=["-".join(map(str, r)) for r in RNNS])
def test_rnns_match_pytorch(devs: tuple[Device, Device], mode: str, direction: str,
                            layers: int) -> None:
    torch = torch_or_none()
    if torch is None:
        pytest.skip("PyTorch with CUDA is not available")
    gpu, _ = devs
    data = _rnn_data(mode, direction, layers, 4)
    _, got = _run_rnn(gpu, mode, direction, layers, data, DType.F32)
    bi = direction == "bi"
    if mode == "lstm":
        net = torch.nn.LSTM(IN, H, num_layers=layers, bidirectional=bi)
    elif mode == "gru":
        net = torch.nn.GRU(IN, H, num_layers=layers, bidirectional=bi)
    else:
        net = torch.nn.RNN(IN, H, num_layers=layers, bidirectional=bi,
                           nonlinearity=mode.removeprefix("rnn_"))
    net = net.cuda()
    at = 0
    with torch.no_grad():
        for weight in net._flat_weights:  # PyTorch's order: our packed layout
            n = weight.numel()
            weight.copy_(torch.tensor(data["w"][at:at + n].reshape(weight.shape)))
            at += n
    assert at == data["w"].size
    t = {k: torch.tensor(v, dtype=torch.float32, device="cuda") for k, v in data.items()}
    x, h0, c0 = (t[k].clone().requires_grad_(True) for k in ("x", "h0", "c0"))
    if mode == "lstm":
        y, (h_n, c_n) = net(x, (h0, c0))
        loss = (y * t["dy"]).sum() + (h_n * t["dh"]).sum() + (c_n * t["dc"]).sum()
    else:
        y, h_n = net(x, h0)
        loss = (y * t["dy"]).sum() + (h_n * t["dh"]).sum()
    loss.backward()
    dw = torch.cat([w.grad.reshape(-1) for w in net._flat_weights])
    checks = {"y": y, "h_out": h_n, "dx": x.grad, "dh": h0.grad, "dw": dw}
    if mode == "lstm":
        checks.update(c_out=c_n, dc=c0.grad)
    for key, value in checks.items():
        want = value.detach().double().cpu().numpy()
        assert rel(got[key], want) <= 1e-4, (key, rel(got[key], want))


def test_report_paths() -> None:
    """Print which path each op ran (cudnn-graph, cupy or composed)."""
    for key, paths in sorted(PATHS.items()):
        print(f"PATH {key}: {', '.join(sorted(paths))}")
