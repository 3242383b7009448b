"""cuDNN normalizations and RNNs on the CPU backend, against NumPy references written here.

Each forward is compared with a plain reference of its definition on random
data; ``norm_bwd`` and ``rnn_bwd`` are checked against central finite
differences of those references (f64). Bad inputs raise typed errors and the
device keeps serving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    Cudnn,
    Device,
    DTypeMismatch,
    GpuRuntimeError,
    InvalidArgument,
    RnnBwdInputs,
    System,
)
from atomr_accel.cudnn import rnn_weight_count

Arr = np.ndarray[Any, Any]
EPS = 1e-5


@pytest.fixture(scope="module")
def dev() -> Iterator[Device]:
    with System.open("cudnn-norm-rnn") as system:
        yield system.spawn_device(mock=True)


@pytest.fixture(scope="module")
def cudnn(dev: Device) -> Cudnn:
    return dev.cudnn()


def put(dev: Device, a: Arr) -> Any:
    """A buffer of ``a``'s dtype holding ``a`` (flattened)."""
    buf = dev.allocate(a.size, str(a.dtype).replace("float", "f"))
    dev.copy_from_numpy(buf, np.ascontiguousarray(a).ravel())
    return buf


def get(dev: Device, buf: Any, shape: tuple[int, ...]) -> Arr:
    return dev.copy_to_numpy(buf)[: int(np.prod(shape))].reshape(shape)


# ------------------------------------------------------------ norm references


def ref_norm(mode: str, x: Arr, scale: Arr, bias: Arr | None, eps: float = EPS,
             norm_axes: int = 1, groups: int = 1) -> tuple[Arr, Arr | None, Arr]:
    """``(y, mean, inverse std)`` of the normalization, written from its definition."""
    if mode in ("layer", "rms"):
        lead = x.shape[: x.ndim - norm_axes]
        rows = x.reshape(int(np.prod(lead)), -1)
        if mode == "rms":
            inv = 1 / np.sqrt((rows**2).mean(axis=1) + eps)
            y = rows * inv[:, None] * scale.ravel()
            mean = None
        else:
            mean = rows.mean(axis=1)
            inv = 1 / np.sqrt(rows.var(axis=1) + eps)
            y = (rows - mean[:, None]) * inv[:, None] * scale.ravel()
        if bias is not None:
            y = y + bias.ravel()
        return y.reshape(x.shape), mean, inv
    n, c = x.shape[:2]
    flat = x.reshape(n, c, -1)
    if mode == "batch":
        mean, var = flat.mean(axis=(0, 2)), flat.var(axis=(0, 2))
        inv = 1 / np.sqrt(var + eps)
        y = (flat - mean[None, :, None]) * inv[None, :, None]
    elif mode == "instance":
        mean, var = flat.mean(axis=2), flat.var(axis=2)
        inv = 1 / np.sqrt(var + eps)
        y = (flat - mean[:, :, None]) * inv[:, :, None]
    else:
        grouped = flat.reshape(n, groups, -1)
        mean, var = grouped.mean(axis=2), grouped.var(axis=2)
        inv = 1 / np.sqrt(var + eps)
        y = ((grouped - mean[:, :, None]) * inv[:, :, None]).reshape(flat.shape)
    assert bias is not None
    y = y * scale[None, :, None] + bias[None, :, None]
    return y.reshape(x.shape), mean.ravel(), inv.ravel()


# --------------------------------------------------------------- forward tests


def test_batch_norm_training_updates_running_statistics(dev: Device, cudnn: Cudnn) -> None:
    rng = np.random.default_rng(1)
    dims = (4, 3, 5, 2)
    x = rng.standard_normal(dims) * 2 + 0.5
    scale, bias = rng.standard_normal(3), rng.standard_normal(3)
    rm, rv = rng.standard_normal(3), rng.random(3) + 0.5
    bufs = [put(dev, a) for a in (x, scale, bias, rm, rv)]
    y, sm, sv = dev.allocate_f64(x.size), dev.allocate_f64(3), dev.allocate_f64(3)
    path = cudnn.batch_norm(bufs[0], y, bufs[1], bufs[2], dims, bufs[3], bufs[4], sm, sv,
                            "training", 1e-5, 0.25)
    assert path == "numpy"
    want, mean, inv = ref_norm("batch", x, scale, bias)
    np.testing.assert_allclose(get(dev, y, dims), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(get(dev, sm, (3,)), mean, rtol=1e-12)
    np.testing.assert_allclose(get(dev, sv, (3,)), inv, rtol=1e-12)
    unbiased = x.transpose(1, 0, 2, 3).reshape(3, -1).var(axis=1, ddof=1)
    np.testing.assert_allclose(get(dev, bufs[3], (3,)), 0.75 * rm + 0.25 * mean, rtol=1e-12)
    np.testing.assert_allclose(get(dev, bufs[4], (3,)), 0.75 * rv + 0.25 * unbiased, rtol=1e-12)


@pytest.mark.parametrize("phase", ["inference", "eval"])
def test_batch_norm_inference_uses_running_statistics(dev: Device, cudnn: Cudnn,
                                                      phase: str) -> None:
    rng = np.random.default_rng(2)
    dims = (3, 4, 6)
    x = rng.standard_normal(dims).astype(np.float32)
    scale, bias, rm = (rng.standard_normal(4).astype(np.float32) for _ in range(3))
    rv = (rng.random(4) + 0.5).astype(np.float32)
    y = dev.allocate_f32(x.size)
    bx, bs, bb, brm, brv = (put(dev, a) for a in (x, scale, bias, rm, rv))
    cudnn.batch_norm_f32(bx, y, bs, bb, dims, brm, brv, phase=phase)
    want = (x - rm[:, None]) / np.sqrt(rv[:, None] + EPS) * scale[:, None] + bias[:, None]
    np.testing.assert_allclose(get(dev, y, dims), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(get(dev, brm, (4,)), rm)  # inference reads them only


@pytest.mark.parametrize("phase", ["train", "persistent"])
def test_training_phases_agree(dev: Device, cudnn: Cudnn, phase: str) -> None:
    rng = np.random.default_rng(3)
    dims = (2, 3, 4)
    x, scale, bias = rng.standard_normal(dims), rng.standard_normal(3), rng.standard_normal(3)
    y = dev.allocate_f64(x.size)
    cudnn.batch_norm(put(dev, x), y, put(dev, scale), put(dev, bias), dims, phase=phase)
    np.testing.assert_allclose(get(dev, y, dims), ref_norm("batch", x, scale, bias)[0],
                               rtol=1e-12, atol=1e-12)


def test_layer_instance_group_and_rms_norm(dev: Device, cudnn: Cudnn) -> None:
    rng = np.random.default_rng(4)
    dims = (3, 4, 2, 5)
    x = rng.standard_normal(dims) * 3 - 1
    out = dev.allocate_f64(x.size)
    bx = put(dev, x)
    # layer norm over the last two dims
    k = 10
    scale, bias = rng.standard_normal(k), rng.standard_normal(k)
    sm, sv = dev.allocate_f64(12), dev.allocate_f64(12)
    cudnn.layer_norm(bx, out, put(dev, scale), put(dev, bias), dims, 2, sm, sv)
    want, mean, inv = ref_norm("layer", x, scale, bias, norm_axes=2)
    np.testing.assert_allclose(get(dev, out, dims), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(get(dev, sm, (12,)), mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(get(dev, sv, (12,)), inv, rtol=1e-12)
    # instance and group norm over channels
    scale, bias = rng.standard_normal(4), rng.standard_normal(4)
    sm, sv = dev.allocate_f64(12), dev.allocate_f64(12)
    cudnn.instance_norm(bx, out, put(dev, scale), put(dev, bias), dims, sm, sv)
    want, mean, inv = ref_norm("instance", x, scale, bias)
    np.testing.assert_allclose(get(dev, out, dims), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(get(dev, sv, (12,)), inv, rtol=1e-12)
    sm, sv = dev.allocate_f64(6), dev.allocate_f64(6)
    cudnn.group_norm(bx, out, put(dev, scale), put(dev, bias), dims, 2, sm, sv)
    want, mean, inv = ref_norm("group", x, scale, bias, groups=2)
    np.testing.assert_allclose(get(dev, out, dims), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(get(dev, sm, (6,)), mean, rtol=1e-12, atol=1e-14)
    # RMS norm, with and without a bias
    scale, bias = rng.standard_normal(5), rng.standard_normal(5)
    sv = dev.allocate_f64(24)
    cudnn.rms_norm(bx, out, put(dev, scale), dims, 1, sv)
    want, _, inv = ref_norm("rms", x, scale, None)
    np.testing.assert_allclose(get(dev, out, dims), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(get(dev, sv, (24,)), inv, rtol=1e-12)
    cudnn.rms_norm(bx, out, put(dev, scale), dims, 1, bias=put(dev, bias))
    np.testing.assert_allclose(get(dev, out, dims), ref_norm("rms", x, scale, bias)[0],
                               rtol=1e-12, atol=1e-12)


def test_norm_axes_as_a_list_of_axes_or_a_count(dev: Device, cudnn: Cudnn) -> None:
    """The original's ``layer_norm_f32(..., dims, norm_axes=[1, 2, 3])`` (which axes) and
    ours (how many trailing axes) give the same norm; anything but a trailing run is refused."""
    rng = np.random.default_rng(12)
    dims = (2, 3, 4, 5)
    x = rng.standard_normal(dims).astype(np.float32) * 2 + 1
    bx, out = put(dev, x), dev.allocate_f32(x.size)
    for axes, count in (([1, 2, 3], 3), ((2, 3), 2), ([-1], 1), ([-3, -2, -1], 3), (3, 3)):
        k = int(np.prod(dims[4 - count:]))
        scale, bias = rng.standard_normal(k), rng.standard_normal(k)
        sm, sv = dev.allocate_f32(120 // k), dev.allocate_f32(120 // k)
        cudnn.layer_norm_f32(bx, out, put(dev, scale.astype(np.float32)),
                             put(dev, bias.astype(np.float32)), dims, axes, sm, sv)
        want, mean, _ = ref_norm("layer", x.astype(np.float64), scale, bias, norm_axes=count)
        np.testing.assert_allclose(get(dev, out, dims), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(get(dev, sm, mean.shape), mean, rtol=1e-5, atol=1e-5)
        cudnn.rms_norm_f32(bx, out, put(dev, scale.astype(np.float32)), dims, axes)
        np.testing.assert_allclose(get(dev, out, dims), ref_norm("rms", x, scale, None,
                                   norm_axes=count)[0], rtol=1e-4, atol=1e-4)
    s20, b20 = put(dev, np.ones(20, np.float32)), put(dev, np.zeros(20, np.float32))
    for bad in ([1, 3], [0], [2, 2, 3], [3, 2], [], [4], [-5, -4], 0, 5, [2.0, 3.0], "2",
                True):
        with pytest.raises(InvalidArgument, match="norm_axes must be a count from 1 to 4"):
            cudnn.layer_norm_f32(bx, out, s20, b20, dims, bad)
    with pytest.raises(InvalidArgument, match="norm_axes"):
        cudnn.rms_norm(bx, out, s20, dims, [1, 3])
    dx, g = dev.allocate_f32(x.size), put(dev, rng.standard_normal(dims).astype(np.float32))
    cudnn.norm_bwd_f32(bx, g, s20, None, None, dx, None, None, dims, "layer", norm_axes=[2, 3])
    want = dev.copy_to_numpy(dx).copy()
    cudnn.norm_bwd_f32(bx, g, s20, None, None, dx, None, None, dims, "layer", norm_axes=2)
    np.testing.assert_array_equal(dev.copy_to_numpy(dx), want)
    with pytest.raises(InvalidArgument, match="norm_axes"):
        cudnn.norm_bwd_f32(bx, g, s20, None, None, dx, None, None, dims, "layer",
                           norm_axes=[1, 3])
    # the device still serves
    cudnn.layer_norm_f32(bx, out, s20, b20, dims, [2, 3])
    assert np.abs(get(dev, out, dims).mean(axis=(2, 3))).max() < 1e-5


@pytest.mark.parametrize("dtype", [np.float16, "bf16"])
def test_half_precision_data_take_f32_parameters(dev: Device, cudnn: Cudnn,
                                                 dtype: Any) -> None:
    if dtype == "bf16":
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    dims = (6, 16)
    x = rng.standard_normal(dims)
    buf = dev.allocate(x.size, "f16" if dtype is np.float16 else "bf16")
    dev.copy_from_numpy(buf, x.ravel().astype(buf.dtype.numpy))
    y = dev.allocate(x.size, buf.dtype)
    scale, bias = rng.standard_normal(16), rng.standard_normal(16)
    cudnn.layer_norm(buf, y, put(dev, scale.astype(np.float32)),
                     put(dev, bias.astype(np.float32)), dims, 1)
    got = dev.copy_to_numpy(y).astype(np.float64).reshape(dims)
    x_rounded = dev.copy_to_numpy(buf).astype(np.float64).reshape(dims)
    tol = 1e-2 if dtype is np.float16 else 6e-2
    np.testing.assert_allclose(got, ref_norm("layer", x_rounded, scale, bias)[0], atol=tol,
                               rtol=tol)


# ------------------------------------------------------------- norm backward


CASES = [  # mode, dims, norm_axes, groups
    ("batch", (3, 2, 4), 1, 1),
    ("layer", (3, 2, 4), 2, 1),
    ("instance", (2, 3, 5), 1, 1),
    ("group", (2, 4, 3), 1, 2),
    ("rms", (4, 6), 1, 1),
]


def _forward(mode: str, norm_axes: int, groups: int) -> Callable[[Arr, Arr, Arr], Arr]:
    def f(x: Arr, scale: Arr, bias: Arr) -> Arr:
        return ref_norm(mode, x, scale, bias, norm_axes=norm_axes, groups=groups)[0]
    return f


def _numeric(f: Callable[[Arr], float], a: Arr, h: float = 1e-6) -> Arr:
    grad = np.empty_like(a)
    for i in range(a.size):
        up, down = a.copy(), a.copy()
        up.flat[i] += h
        down.flat[i] -= h
        grad.flat[i] = (f(up) - f(down)) / (2 * h)
    return grad


@pytest.mark.parametrize(("mode", "dims", "norm_axes", "groups"), CASES,
                         ids=[c[0] for c in CASES])
@pytest.mark.parametrize("saved", [True, False], ids=["saved", "recomputed"])
def test_norm_bwd_matches_finite_differences(dev: Device, cudnn: Cudnn, mode: str,
                                             dims: tuple[int, ...], norm_axes: int,
                                             groups: int, saved: bool) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal(dims) * 2 + 0.3
    params = dims[1] if mode in ("batch", "instance", "group") else \
        int(np.prod(dims[len(dims) - norm_axes:]))
    scale, bias = rng.standard_normal(params), rng.standard_normal(params)
    dy = rng.standard_normal(dims)
    f = _forward(mode, norm_axes, groups)
    want_dx = _numeric(lambda a: float((f(a, scale, bias) * dy).sum()), x)
    want_ds = _numeric(lambda a: float((f(x, a, bias) * dy).sum()), scale)
    want_db = _numeric(lambda a: float((f(x, scale, a) * dy).sum()), bias)
    _, mean, inv = ref_norm(mode, x, scale, bias, norm_axes=norm_axes, groups=groups)
    mean_buf = put(dev, mean) if saved and mean is not None else None
    inv_buf = put(dev, inv) if saved else None
    dx, ds, db = dev.allocate_f64(x.size), dev.allocate_f64(params), dev.allocate_f64(params)
    path = cudnn.norm_bwd(put(dev, x), put(dev, dy), put(dev, scale), mean_buf, inv_buf, dx,
                          ds, db, dims, mode, norm_axes=norm_axes, groups=groups)
    assert path == "numpy"
    np.testing.assert_allclose(get(dev, dx, dims), want_dx, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(get(dev, ds, (params,)), want_ds, rtol=1e-6, atol=1e-7)
    if mode == "rms":  # the reference had no bias: dbias is the sum of dy over rows
        want_db = dy.reshape(-1, params).sum(axis=0)
    np.testing.assert_allclose(get(dev, db, (params,)), want_db, rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------- RNN reference


GATES = {"rnn_tanh": 1, "rnn_relu": 1, "lstm": 4, "gru": 3}


def ref_weight_layout(mode: str, dirs: int, layers: int, inp: int, hid: int,
                      w: Arr) -> list[list[tuple[Arr, Arr, Arr, Arr]]]:
    """Unpack PyTorch's order: per layer, per direction, w_ih, w_hh, b_ih, b_hh."""
    g, at, out = GATES[mode], 0, []
    for layer in range(layers):
        width = inp if layer == 0 else dirs * hid
        row = []
        for _ in range(dirs):
            parts = []
            for shape in ((g * hid, width), (g * hid, hid), (g * hid,), (g * hid,)):
                size = int(np.prod(shape))
                parts.append(w[at:at + size].reshape(shape))
                at += size
            row.append((parts[0], parts[1], parts[2], parts[3]))
        out.append(row)
    assert at == w.size
    return out


def _sig(v: Arr) -> Arr:
    return 1 / (1 + np.exp(-v))


def ref_rnn(mode: str, dirs: int, layers: int, x: Arr, w: Arr, h0: Arr,
            c0: Arr) -> tuple[Arr, Arr, Arr]:
    """``(y, h_n, c_n)`` of PyTorch's RNN/LSTM/GRU equations, step by step."""
    t_len, _, inp = x.shape
    hid = h0.shape[2]
    weights = ref_weight_layout(mode, dirs, layers, inp, hid, w)
    h_n, c_n = np.zeros_like(h0), np.zeros_like(c0)
    seq = x
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            w_ih, w_hh, b_ih, b_hh = weights[layer][d]
            h, c = h0[layer * dirs + d], c0[layer * dirs + d]
            out = np.zeros((t_len, x.shape[1], hid))
            for t in (range(t_len - 1, -1, -1) if d else range(t_len)):
                a = seq[t] @ w_ih.T + b_ih
                b = h @ w_hh.T + b_hh
                if mode == "lstm":
                    i = _sig(a[:, :hid] + b[:, :hid])
                    f = _sig(a[:, hid:2 * hid] + b[:, hid:2 * hid])
                    g = np.tanh(a[:, 2 * hid:3 * hid] + b[:, 2 * hid:3 * hid])
                    o = _sig(a[:, 3 * hid:] + b[:, 3 * hid:])
                    c = f * c + i * g
                    h = o * np.tanh(c)
                elif mode == "gru":
                    r = _sig(a[:, :hid] + b[:, :hid])
                    z = _sig(a[:, hid:2 * hid] + b[:, hid:2 * hid])
                    n = np.tanh(a[:, 2 * hid:] + r * b[:, 2 * hid:])
                    h = (1 - z) * n + z * h
                elif mode == "rnn_tanh":
                    h = np.tanh(a + b)
                else:
                    h = np.maximum(a + b, 0)
                out[t] = h
            h_n[layer * dirs + d], c_n[layer * dirs + d] = h, c
            outs.append(out)
        seq = np.concatenate(outs, axis=2)
    return seq, h_n, c_n


def test_weight_count_is_pytorchs(dev: Device) -> None:
    assert rnn_weight_count("lstm", "uni", 1, 3, 4) == 4 * 4 * (3 + 4) + 2 * 16
    assert rnn_weight_count("gru", "bidirectional", 2, 3, 4) == \
        2 * (12 * 7 + 24) + 2 * (12 * (8 + 4) + 24)
    assert rnn_weight_count("rnn", "bi", 1, 5, 2) == 2 * (2 * 7 + 4)


RNN_CASES = [("lstm", "uni", 1), ("lstm", "bi", 2), ("gru", "bidirectional", 2),
             ("rnn_tanh", "uni", 2), ("rnn", "bi", 1), ("rnn_relu", "unidirectional", 1)]


def _rnn_data(mode: str, direction: str, layers: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    t_len, batch, inp, hid = 4, 2, 3, 3
    dirs = 2 if direction.startswith("bi") else 1
    canon = "rnn_tanh" if mode == "rnn" else mode
    count = rnn_weight_count(mode, direction, layers, inp, hid)
    return {"mode": mode, "canon": canon, "direction": direction, "layers": layers,
            "dirs": dirs, "T": t_len, "B": batch, "I": inp, "H": hid,
            "x": rng.standard_normal((t_len, batch, inp)),
            "w": rng.standard_normal(count) * 0.6,
            "h0": rng.standard_normal((layers * dirs, batch, hid)) * 0.5,
            "c0": rng.standard_normal((layers * dirs, batch, hid)) * 0.5}


@pytest.mark.parametrize(("mode", "direction", "layers"), RNN_CASES,
                         ids=["-".join(map(str, c)) for c in RNN_CASES])
def test_rnn_fwd_matches_the_reference(dev: Device, cudnn: Cudnn, mode: str,
                                       direction: str, layers: int) -> None:
    d = _rnn_data(mode, direction, layers, 7)
    lstm = mode == "lstm"
    y = dev.allocate_f64(d["T"] * d["B"] * d["dirs"] * d["H"])
    h_out, c_out = dev.allocate_f64(d["h0"].size), dev.allocate_f64(d["h0"].size)
    path = cudnn.rnn_fwd(put(dev, d["x"]), put(dev, d["h0"]), put(dev, d["w"]), y, h_out,
                         put(dev, d["c0"]) if lstm else None, c_out if lstm else None, mode,
                         direction, layers, d["I"], d["H"], d["T"], d["B"])
    assert path == "numpy"
    want_y, want_h, want_c = ref_rnn(d["canon"], d["dirs"], layers, d["x"], d["w"], d["h0"],
                                     d["c0"])
    np.testing.assert_allclose(get(dev, y, want_y.shape), want_y, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(get(dev, h_out, want_h.shape), want_h, rtol=1e-12, atol=1e-13)
    if lstm:
        np.testing.assert_allclose(get(dev, c_out, want_c.shape), want_c, rtol=1e-12,
                                   atol=1e-13)


def test_rnn_fwd_f32_starts_from_zero_states(dev: Device, cudnn: Cudnn) -> None:
    d = _rnn_data("gru", "uni", 1, 8)
    y = dev.allocate_f32(d["T"] * d["B"] * d["H"])
    cudnn.rnn_fwd_f32(put(dev, d["x"].astype(np.float32)), None,
                      put(dev, d["w"].astype(np.float32)), y, None, mode="gru",
                      input_size=d["I"], hidden_size=d["H"], seq_length=d["T"],
                      batch_size=d["B"])
    want, _, _ = ref_rnn("gru", 1, 1, d["x"], d["w"], 0 * d["h0"], 0 * d["c0"])
    np.testing.assert_allclose(get(dev, y, want.shape), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("mode", "direction", "layers"),
                         [("lstm", "bi", 2), ("gru", "bi", 2), ("rnn_tanh", "uni", 2),
                          ("rnn_relu", "bi", 1)])
def test_rnn_bwd_matches_finite_differences(dev: Device, cudnn: Cudnn, mode: str,
                                            direction: str, layers: int) -> None:
    d = _rnn_data(mode, direction, layers, 9)
    rng = np.random.default_rng(10)
    lstm = mode == "lstm"
    gy = rng.standard_normal((d["T"], d["B"], d["dirs"] * d["H"]))
    gh, gc = rng.standard_normal(d["h0"].shape), rng.standard_normal(d["h0"].shape)

    def loss(x: Arr, w: Arr, h0: Arr, c0: Arr) -> float:
        y, h_n, c_n = ref_rnn(mode, d["dirs"], layers, x, w, h0, c0)
        return float((y * gy).sum() + (h_n * gh).sum() + ((c_n * gc).sum() if lstm else 0))

    x, w, h0, c0 = d["x"], d["w"], d["h0"], d["c0"]
    bufs = {name: put(dev, a) for name, a in (("x", x), ("w", w), ("h0", h0), ("c0", c0),
                                                ("gy", gy), ("gh", gh), ("gc", gc))}
    dx, dw = dev.allocate_f64(x.size), dev.allocate_f64(w.size)
    dh, dc = dev.allocate_f64(h0.size), dev.allocate_f64(h0.size)
    inputs = (RnnBwdInputs().set_x(bufs["x"]).set_weights(bufs["w"]).set_h_in(bufs["h0"])
              .set_dy(bufs["gy"]).set_dh_out(bufs["gh"]).set_dx(dx).set_dweights(dw)
              .set_dh_in(dh).set_mode(mode).set_direction(direction).set_num_layers(layers)
              .set_input_size(d["I"]).set_hidden_size(d["H"]).set_seq_length(d["T"])
              .set_batch_size(d["B"]))
    if lstm:
        inputs.set_c_in(bufs["c0"]).set_dc_out(bufs["gc"]).set_dc_in(dc)
    assert cudnn.rnn_bwd(inputs) == "numpy"
    assert inputs.is_consumed()
    np.testing.assert_allclose(get(dev, dx, x.shape),
                               _numeric(lambda a: loss(a, w, h0, c0), x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(get(dev, dw, w.shape),
                               _numeric(lambda a: loss(x, a, h0, c0), w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(get(dev, dh, h0.shape),
                               _numeric(lambda a: loss(x, w, a, c0), h0), rtol=1e-6, atol=1e-7)
    if lstm:
        np.testing.assert_allclose(get(dev, dc, c0.shape),
                                   _numeric(lambda a: loss(x, w, h0, a), c0), rtol=1e-6,
                                   atol=1e-7)


# ------------------------------------------------------------------ bad input


def test_bad_inputs_raise_typed_errors_and_the_device_keeps_serving(dev: Device,
                                                                    cudnn: Cudnn) -> None:
    x, y = dev.allocate_f32(24), dev.allocate_f32(24)
    s3, b3 = dev.allocate_f32(3), dev.allocate_f32(3)
    dev.copy_from_numpy(x, np.random.default_rng(11).standard_normal(24).astype(np.float32))
    dev.copy_from_numpy(s3, np.ones(3, np.float32))
    with pytest.raises(InvalidArgument, match="phase must be one of"):
        cudnn.batch_norm_f32(x, y, s3, b3, (2, 3, 4), phase="warmup")
    with pytest.raises(InvalidArgument, match="mode must be one of"):
        cudnn.norm_bwd_f32(x, y, s3, None, None, y, None, None, (2, 3, 4), "batchy")
    with pytest.raises(InvalidArgument, match="x needs 48 elements"):
        cudnn.batch_norm_f32(x, y, s3, b3, (4, 3, 4))
    with pytest.raises(InvalidArgument, match="scale needs 4 elements"):
        cudnn.instance_norm_f32(x, y, s3, b3, (2, 4, 3))
    with pytest.raises(InvalidArgument, match="f32 parameters"):
        cudnn.layer_norm(x, y, dev.allocate_f64(4), b3, (6, 4), 1)
    with pytest.raises(DTypeMismatch):
        cudnn.layer_norm_f32(dev.allocate_f64(24), y, s3, b3, (8, 3), 1)
    with pytest.raises(InvalidArgument, match="groups must be a positive int dividing"):
        cudnn.group_norm_f32(x, y, s3, b3, (2, 3, 4), 2)
    with pytest.raises(InvalidArgument, match="needs running_mean and running_var"):
        cudnn.batch_norm_f32(x, y, s3, b3, (2, 3, 4), phase="eval")
    with pytest.raises(InvalidArgument, match="rms norm has no mean"):
        cudnn.norm_bwd_f32(x, y, dev.allocate_f32(4), s3, s3, y, None, None, (6, 4), "rms")
    with pytest.raises(InvalidArgument, match="mode must be one of"):
        cudnn.rnn_fwd_f32(x, None, x, y, None, mode="transformer", input_size=1,
                          hidden_size=1, seq_length=1, batch_size=1)
    with pytest.raises(InvalidArgument, match="hidden_size must be a positive int"):
        cudnn.rnn_fwd_f32(x, None, x, y, None, input_size=1, seq_length=1, batch_size=1)
    with pytest.raises(InvalidArgument, match="weights needs"):
        cudnn.rnn_fwd_f32(x, None, x, y, None, input_size=2, hidden_size=2, seq_length=2,
                          batch_size=2)
    with pytest.raises(InvalidArgument, match="only an lstm has one"):
        cudnn.rnn_fwd_f32(x, None, x, y, None, x, None, "gru", input_size=1, hidden_size=1,
                          seq_length=1, batch_size=1)
    with pytest.raises(InvalidArgument, match="dropout between layers is not supported"):
        cudnn.rnn_fwd_f32(x, None, x, y, None, input_size=1, hidden_size=1, seq_length=1,
                          batch_size=1, dropout=0.2)
    # the device still serves
    dev.copy_from_numpy(b3, np.zeros(3, np.float32))
    assert cudnn.batch_norm_f32(x, y, s3, b3, (2, 3, 4)) == "numpy"
    assert abs(float(dev.copy_to_numpy(y).mean())) < 1e-6


def test_rnn_bwd_inputs_builder(dev: Device, cudnn: Cudnn) -> None:
    inputs = RnnBwdInputs()
    with pytest.raises(GpuRuntimeError, match="mode must be one of"):
        inputs.set_mode("transformer")
    with pytest.raises(GpuRuntimeError, match="direction must be one of"):
        inputs.set_direction("sideways")
    assert "mode='lstm'" in repr(inputs) and "consumed=False" in repr(inputs)
    with pytest.raises(InvalidArgument, match="needs x"):
        cudnn.rnn_bwd_f32(inputs)
    assert not inputs.is_consumed()
    d = _rnn_data("rnn_tanh", "uni", 1, 12)
    f64 = {k: put(dev, d[k]) for k in ("x", "w")}
    inputs.set_x(f64["x"]).set_weights(f64["w"]).set_dy(dev.allocate_f64(24))
    inputs.set_dx(dev.allocate_f64(24)).set_dweights(dev.allocate_f64(d["w"].size))
    inputs.set_mode("rnn").set_input_size(3).set_hidden_size(3).set_seq_length(4)
    inputs.set_batch_size(2)
    with pytest.raises(DTypeMismatch):
        cudnn.rnn_bwd_f32(inputs)  # f64 buffers for the f32 form
    assert cudnn.rnn_bwd(inputs) == "numpy"
    assert inputs.is_consumed() and "consumed=True" in repr(inputs)
    with pytest.raises(InvalidArgument, match="consumed"):
        cudnn.rnn_bwd(inputs)
