"""Attention (FlashAttn and Cudnn's multi-head attention) against a per-head NumPy reference.

The reference below loops over sequences, heads and query rows and writes the
mask rule out by hand (bottom-right aligned queries, causal, a left window,
sink tokens, ALiBi); it shares no code with the implementation. Backward ops
are checked against central finite differences of that reference. Ragged and
paged calls must equal the reference on the gathered dense data. GPU tests
(``-m gpu``) compare the CUDA results with the CPU backend in float64 and with
``torch.nn.functional.scaled_dot_product_attention`` where PyTorch imports.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import atomr_accel.cudnn
import atomr_accel.facade
from atomr_accel import DType, GpuRuntimeError, InvalidArgument, MultiHeadAttnBwdInputs, System

Arr = np.ndarray[Any, Any]


# ------------------------------------------------------------------ the reference


def ref_slopes(heads: int) -> Arr:
    """ALiBi slopes: geometric over the largest power of two, the rest at half steps."""
    n = 2 ** math.floor(math.log2(heads))
    first = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    rest = [2.0 ** (-8.0 * (i + 0.5) / n) for i in range(0, 2 * (heads - n), 2)]
    return np.array(first + rest)


def reference(q: Arr, k: Arr, v: Arr, lens_q: list[int], lens_kv: list[int], *,
              causal: bool = False, window: int = 0, sinks: int = 0, slopes: Arr | None = None,
              scale: float | None = None, bias: Arr | None = None,
              keep: Arr | None = None) -> tuple[Arr, Arr]:
    """Attention of dense ``(B, H, S, D)`` arrays, row by row: ``(o, lse)``."""
    b_, hq, sq, d = q.shape
    hkv = k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    o = np.zeros(q.shape)
    lse = np.full((b_, hq, sq), -np.inf)
    for b in range(b_):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(lens_q[b]):
                p = i + lens_kv[b] - lens_q[b]
                cols = []
                for j in range(lens_kv[b]):
                    if causal and j > p:
                        continue
                    if window and p - j >= window and j >= sinks:
                        continue
                    cols.append(j)
                if not cols:
                    continue
                s = np.array([scale * q[b, h, i] @ k[b, kh, j] for j in cols])
                if slopes is not None:
                    s += np.array([slopes[h] * (j - p) for j in cols])
                if bias is not None:
                    s += bias[b, h, i, cols]
                m = s.max()
                w = np.exp(s - m)
                lse[b, h, i] = m + math.log(w.sum())
                w /= w.sum()
                if keep is not None:
                    w = w * keep[b, h, i, cols]
                o[b, h, i] = sum(wj * v[b, kh, j] for wj, j in zip(w, cols, strict=True))
    return o, lse


def numeric_grads(f: Any, arrays: list[Arr], do: Arr, eps: float = 1e-6) -> list[Arr]:
    """Central differences of ``sum(f(*arrays) * do)`` with respect to every array."""
    grads = []
    for a in arrays:
        g = np.zeros_like(a)
        for idx in np.ndindex(*a.shape):
            old = a[idx]
            a[idx] = old + eps
            up = float((f(*arrays) * do).sum())
            a[idx] = old - eps
            down = float((f(*arrays) * do).sum())
            a[idx] = old
            g[idx] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


# -------------------------------------------------------------------- the device


@pytest.fixture(scope="module")
def dev() -> Iterator[Any]:
    with System.open("attention") as system:
        yield system.spawn_device(mock=True)


def put(dev: Any, x: Arr, dtype: DType = DType.F64) -> Any:
    buf = dev.allocate(x.size, dtype)
    dev.copy_from_numpy(buf, np.ascontiguousarray(x).reshape(-1).astype(dtype.numpy))
    return buf


def get(dev: Any, buf: Any, shape: tuple[int, ...]) -> Arr:
    return np.asarray(dev.copy_to_numpy(buf), dtype=np.float64)[:math.prod(shape)].reshape(shape)


def rand(rng: np.random.Generator, *shape: int) -> Arr:
    return rng.standard_normal(shape)


MASKS = [
    {},
    {"causal": True},
    {"window": 3},
    {"causal": True, "window": 2},
    {"causal": True, "window": 2, "sink_tokens": 2},
    {"alibi": True, "causal": True},
    {"alibi": True},
]


@pytest.mark.parametrize("mask", MASKS, ids=lambda m: "-".join(m) or "none")
@pytest.mark.parametrize(("hq", "hkv", "sq", "skv"), [(4, 4, 6, 6), (4, 2, 5, 7), (3, 1, 4, 4)])
def test_forward_matches_reference(dev: Any, mask: dict[str, Any], hq: int, hkv: int, sq: int,
                                   skv: int) -> None:
    rng = np.random.default_rng(hq * 10 + sq)
    b, d = 2, 8
    q, k, v = rand(rng, b, hq, sq, d), rand(rng, b, hkv, skv, d), rand(rng, b, hkv, skv, d)
    o, stats = dev.allocate(q.size, DType.F64), dev.allocate_f32(b * hq * sq)
    ran = dev.flashattn().forward(put(dev, q), put(dev, k), put(dev, v), o, b, hq, hkv, sq, skv,
                                  d, stats=stats, **mask)
    assert ran == "numpy"
    slopes = ref_slopes(hq) if mask.get("alibi") else None
    want, lse = reference(q, k, v, [sq] * b, [skv] * b, causal=mask.get("causal", False),
                          window=mask.get("window", 0), sinks=mask.get("sink_tokens", 0),
                          slopes=slopes)
    np.testing.assert_allclose(get(dev, o, q.shape), want, atol=1e-12)
    np.testing.assert_allclose(get(dev, stats, lse.shape), lse, rtol=1e-6)


def test_bshd_layout_scale_and_caller_slopes(dev: Any) -> None:
    rng = np.random.default_rng(1)
    b, hq, hkv, s, d = 2, 4, 2, 5, 8
    q, k, v = rand(rng, b, hq, s, d), rand(rng, b, hkv, s, d), rand(rng, b, hkv, s, d)
    slopes = rng.uniform(0.1, 1.0, hq)
    o = dev.allocate(q.size, DType.F64)
    dev.flashattn().forward(put(dev, q.transpose(0, 2, 1, 3)), put(dev, k.transpose(0, 2, 1, 3)),
                            put(dev, v.transpose(0, 2, 1, 3)), o, b, hq, hkv, s, s, d,
                            layout="bshd", scale=0.3, alibi=True,
                            alibi_slopes=put(dev, slopes, DType.F32), causal=True)
    want, _ = reference(q, k, v, [s] * b, [s] * b, causal=True, scale=0.3,
                        slopes=slopes.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(get(dev, o, (b, s, hq, d)).transpose(0, 2, 1, 3), want,
                               atol=1e-12)


@pytest.mark.parametrize(("dtype", "tol"), [(DType.F32, 1e-5), (DType.BF16, 2e-2),
                                            (DType.F16, 2e-3)])
def test_forward_in_narrow_dtypes(dev: Any, dtype: DType, tol: float) -> None:
    if dtype is DType.BF16:
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    b, h, s, d = 1, 2, 6, 16
    q, k, v = (rand(rng, b, h, s, d).astype(dtype.numpy).astype(np.float64) for _ in range(3))
    o = dev.allocate(q.size, dtype)
    dev.flashattn().forward(put(dev, q, dtype), put(dev, k, dtype), put(dev, v, dtype), o, b, h,
                            h, s, s, d, causal=True)
    want, _ = reference(q, k, v, [s], [s], causal=True)
    np.testing.assert_allclose(get(dev, o, q.shape), want, atol=tol)


@pytest.mark.parametrize("mask", [{}, {"causal": True}, {"causal": True, "window": 2,
                                                        "sink_tokens": 1},
                                  {"alibi": True, "causal": True}], ids=str)
def test_backward_matches_finite_differences(dev: Any, mask: dict[str, Any]) -> None:
    rng = np.random.default_rng(3)
    b, hq, hkv, sq, skv, d = 1, 2, 1, 3, 4, 4
    q, k, v = rand(rng, b, hq, sq, d), rand(rng, b, hkv, skv, d), rand(rng, b, hkv, skv, d)
    do = rand(rng, b, hq, sq, d)
    slopes = ref_slopes(hq) if mask.get("alibi") else None
    opts = {"causal": mask.get("causal", False), "window": mask.get("window", 0),
            "sinks": mask.get("sink_tokens", 0), "slopes": slopes}
    fa = dev.flashattn()
    bq, bk, bv = put(dev, q), put(dev, k), put(dev, v)
    o, stats = dev.allocate(q.size, DType.F64), dev.allocate_f32(b * hq * sq)
    fa.forward(bq, bk, bv, o, b, hq, hkv, sq, skv, d, stats=stats, **mask)
    dq, dk, dv = (dev.allocate(x.size, DType.F64) for x in (q, k, v))
    ran = fa.backward(bq, bk, bv, o, put(dev, do), stats, dq, dk, dv, b, hq, hkv, sq, skv, d,
                      **mask)
    assert ran == "numpy"
    want = numeric_grads(lambda *a: reference(*a, [sq], [skv], **opts)[0], [q, k, v], do)
    # the statistics are f32, so the recomputed weights carry ~1e-7 relative error
    for buf, x, g in zip((dq, dk, dv), (q, k, v), want, strict=True):
        np.testing.assert_allclose(get(dev, buf, x.shape), g, atol=2e-6)


def _pack(x: Arr, lens: list[int]) -> Arr:
    """Dense ``(B, H, S, D)`` rows of each sequence packed as ``(tokens, H, D)``."""
    return np.concatenate([x[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lens)])


def test_ragged_equals_reference_on_each_sequence(dev: Any) -> None:
    rng = np.random.default_rng(4)
    b, hq, hkv, d, sq, skv = 3, 4, 2, 8, 5, 6
    lens_q, lens_kv = [5, 2, 3], [6, 4, 3]
    q, k, v = rand(rng, b, hq, sq, d), rand(rng, b, hkv, skv, d), rand(rng, b, hkv, skv, d)
    do = rand(rng, b, hq, sq, d)
    cu_q = put(dev, np.cumsum([0, *lens_q]), DType.I32)
    cu_kv = put(dev, np.cumsum([0, *lens_kv]), DType.I32)
    fa = dev.flashattn()
    pq, pk, pv, pdo = (put(dev, _pack(x, n)) for x, n in ((q, lens_q), (k, lens_kv),
                                                          (v, lens_kv), (do, lens_q)))
    o, stats = dev.allocate(sum(lens_q) * hq * d, DType.F64), dev.allocate_f32(b * hq * sq)
    opts = {"layout": "thd", "cu_seqlens_q": cu_q, "cu_seqlens_kv": cu_kv, "causal": True}
    fa.forward(pq, pk, pv, o, b, hq, hkv, sq, skv, d, stats=stats, **opts)
    want, lse = reference(q, k, v, lens_q, lens_kv, causal=True)
    np.testing.assert_allclose(get(dev, o, (sum(lens_q), hq, d)), _pack(want, lens_q),
                               atol=1e-12)
    got_lse = get(dev, stats, lse.shape)
    for i, n in enumerate(lens_q):
        np.testing.assert_allclose(got_lse[i, :, :n], lse[i, :, :n], rtol=1e-6)
    dq, dk, dv = (dev.allocate(sum(n) * h * d, DType.F64)
                  for n, h in ((lens_q, hq), (lens_kv, hkv), (lens_kv, hkv)))
    fa.backward(pq, pk, pv, o, pdo, stats, dq, dk, dv, b, hq, hkv, sq, skv, d, **opts)
    for i in range(b):  # each sequence alone, dense, by finite differences
        sl = (slice(i, i + 1), slice(None), slice(0, lens_q[i]))
        sk = (slice(i, i + 1), slice(None), slice(0, lens_kv[i]))
        g = numeric_grads(lambda *a, i=i: reference(*a, [lens_q[i]], [lens_kv[i]],
                                                    causal=True)[0],
                          [q[sl].copy(), k[sk].copy(), v[sk].copy()], do[sl])
        offs_q, offs_kv = sum(lens_q[:i]), sum(lens_kv[:i])
        got_q = get(dev, dq, (sum(lens_q), hq, d))[offs_q:offs_q + lens_q[i]]
        got_k = get(dev, dk, (sum(lens_kv), hkv, d))[offs_kv:offs_kv + lens_kv[i]]
        got_v = get(dev, dv, (sum(lens_kv), hkv, d))[offs_kv:offs_kv + lens_kv[i]]
        for got, want_g in ((got_q, g[0]), (got_k, g[1]), (got_v, g[2])):
            np.testing.assert_allclose(got, want_g[0].transpose(1, 0, 2), atol=2e-6)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_paged_cache_equals_gathered_dense(dev: Any, layout: str) -> None:
    rng = np.random.default_rng(5)
    b, hq, hkv, d, bs, blocks, sq = 3, 4, 2, 8, 4, 10, 2
    seq_kv = 12  # table columns: 3 blocks per sequence
    ctx = [12, 7, 3]
    cache_k, cache_v = rand(rng, blocks, hkv, bs, d), rand(rng, blocks, hkv, bs, d)
    table = rng.permutation(blocks)[:9].reshape(b, 3)
    q = rand(rng, b, hq, sq, d)
    dense_k = np.zeros((b, hkv, seq_kv, d))
    dense_v = np.zeros((b, hkv, seq_kv, d))
    for i in range(b):
        for t in range(seq_kv):
            dense_k[i, :, t] = cache_k[table[i, t // bs], :, t % bs]
            dense_v[i, :, t] = cache_v[table[i, t // bs], :, t % bs]
    stored = (lambda x: x) if layout == "bhsd" else (lambda x: x.transpose(0, 2, 1, 3))
    qs = q if layout == "bhsd" else q.transpose(0, 2, 1, 3)
    o = dev.allocate(q.size, DType.F64)
    ran = dev.flashattn().forward(
        put(dev, qs), put(dev, stored(cache_k)), put(dev, stored(cache_v)), o, b, hq, hkv, sq,
        seq_kv, d, layout=layout, block_table=put(dev, table, DType.I32),
        context_lens=put(dev, np.array(ctx), DType.I32), block_size=bs, causal=True)
    assert ran == "numpy"
    want, _ = reference(q, dense_k, dense_v, [sq] * b, ctx, causal=True)
    got = get(dev, o, qs.shape)
    got = got if layout == "bhsd" else got.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_cudnn_multihead_attention_forward_and_builder_backward(dev: Any) -> None:
    rng = np.random.default_rng(6)
    b, hq, hkv, sq, skv, d = 1, 2, 2, 3, 4, 4
    p, seed = 0.25, 11
    q, k, v = (x.astype(np.float32).astype(np.float64)
               for x in (rand(rng, b, hq, sq, d), rand(rng, b, hkv, skv, d),
                         rand(rng, b, hkv, skv, d)))
    do = rand(rng, b, hq, sq, d).astype(np.float32).astype(np.float64)
    bias = rand(rng, b, hq, sq, skv).astype(np.float32).astype(np.float64)
    cudnn = dev.cudnn()
    f32 = DType.F32
    bq, bk, bv, bdo = (put(dev, x, f32) for x in (q, k, v, do))
    o, stats = dev.allocate_f32(q.size), dev.allocate_f32(b * hq * sq)
    ran = cudnn.multihead_attn_fwd_f32(bq, bk, bv, o, b, sq, skv, hq, hkv, d, stats=stats,
                                       bias=put(dev, bias, f32), mask="causal_sliding_window",
                                       window=2)
    assert ran == "numpy"
    want, _ = reference(q, k, v, [sq], [skv], causal=True, window=2, bias=bias)
    np.testing.assert_allclose(get(dev, o, q.shape), want, atol=1e-5)
    # dropout: the documented Philox(seed) mask, the same on forward and backward
    keep = (np.random.Generator(np.random.Philox(seed)).random((b, hq, sq, skv)) >= p) / (1 - p)
    cudnn.multihead_attn_fwd_f32(bq, bk, bv, o, b, sq, skv, hq, hkv, d, stats=stats,
                                 mask="causal", dropout=p, dropout_seed=seed)
    want, _ = reference(q, k, v, [sq], [skv], causal=True, keep=keep)
    np.testing.assert_allclose(get(dev, o, q.shape), want, atol=1e-5)
    inputs = MultiHeadAttnBwdInputs()
    dq, dk, dv = (dev.allocate_f32(x.size) for x in (q, k, v))
    for name, buf in (("q", bq), ("k", bk), ("v", bv), ("o", o), ("do", bdo), ("dq", dq),
                      ("dk", dk), ("dv", dv), ("stats", stats)):
        getattr(inputs, f"set_{name}")(buf)
    for name, value in (("batch", b), ("seq_q", sq), ("seq_kv", skv), ("heads_q", hq),
                        ("heads_kv", hkv), ("head_dim", d)):
        getattr(inputs, f"set_{name}")(value)
    inputs.set_mask("causal")
    inputs.set_dropout(p)
    inputs.set_dropout_seed(seed)
    assert "MultiHeadAttnBwdInputs(batch=1" in repr(inputs) and not inputs.is_consumed()
    inputs.set_dq(dev.allocate_f64(q.size))  # refused, and the builder can be fixed
    with pytest.raises(GpuRuntimeError):
        cudnn.multihead_attn_bwd_f32(inputs)
    assert not inputs.is_consumed()
    inputs.set_dq(dq)
    assert cudnn.multihead_attn_bwd_f32(inputs) == "numpy"
    assert inputs.is_consumed()
    with pytest.raises(InvalidArgument):
        cudnn.multihead_attn_bwd_f32(inputs)
    g = numeric_grads(lambda *a: reference(*a, [sq], [skv], causal=True, keep=keep)[0],
                      [q, k, v], do)
    for buf, x, want_g in zip((dq, dk, dv), (q, k, v), g, strict=True):
        np.testing.assert_allclose(get(dev, buf, x.shape), want_g, atol=1e-4)
    again = MultiHeadAttnBwdInputs()  # no statistics: they are computed again
    for name, value in (("q", bq), ("k", bk), ("v", bv), ("o", o), ("do", bdo), ("dq", dq),
                        ("dk", dk), ("dv", dv), ("batch", b), ("seq_q", sq), ("seq_kv", skv),
                        ("heads_q", hq), ("heads_kv", hkv), ("head_dim", d)):
        getattr(again, f"set_{name}")(value)
    again.set_mask("causal")
    again.set_dropout(p)
    again.set_dropout_seed(seed)
    cudnn.multihead_attn_bwd_f32(again)
    for buf, x, want_g in zip((dq, dk, dv), (q, k, v), g, strict=True):
        np.testing.assert_allclose(get(dev, buf, x.shape), want_g, atol=1e-4)


def test_builder_refuses_a_bad_mask_and_missing_inputs(dev: Any) -> None:
    inputs = MultiHeadAttnBwdInputs()
    with pytest.raises(GpuRuntimeError, match="mask must be one of"):
        inputs.set_mask("diagonal")
    with pytest.raises(InvalidArgument, match="no q"):
        dev.cudnn().multihead_attn_bwd_f32(inputs)
    assert atomr_accel.cudnn.MultiHeadAttnBwdInputs is MultiHeadAttnBwdInputs
    assert atomr_accel.facade.MultiHeadAttnBwdInputs is MultiHeadAttnBwdInputs


def test_capability_query(dev: Any) -> None:
    fa = dev.flashattn()
    assert fa.forward_f16() == "numpy"
    assert fa.forward_f16("sm_90", 128, 4, "causal_sliding_window", 256, False, 4) == "numpy"
    for bad in ({"arch": "sm_70"}, {"head_dim": 60}, {"mask": "diagonal"},
                {"mask": "sliding_window"}, {"mask": "causal", "sink_tokens": 2},
                {"gqa_ratio": 0}, {"softmax_scale": -1.0}):
        with pytest.raises(InvalidArgument):
            fa.forward_f16(**bad)


def test_bad_inputs_are_typed_errors_and_the_device_keeps_serving(dev: Any) -> None:
    rng = np.random.default_rng(7)
    fa = dev.flashattn()
    b, h, s, d = 1, 4, 4, 8
    q = put(dev, rand(rng, b, h, s, d))
    k = put(dev, rand(rng, b, h, s, d))
    o = dev.allocate(b * h * s * d, DType.F64)
    with pytest.raises(InvalidArgument, match="multiple of heads_kv"):
        fa.forward(q, k, k, o, b, h, 3, s, s, d)
    with pytest.raises(InvalidArgument, match="needs"):
        fa.forward(q, k, k, o, b, h, h, s + 1, s, d)
    with pytest.raises(InvalidArgument, match="dtype"):
        fa.forward(q, put(dev, rand(rng, b, h, s, d), DType.F32), k, o, b, h, h, s, s, d)
    with pytest.raises(InvalidArgument, match="layout"):
        fa.forward(q, k, k, o, b, h, h, s, s, d, layout="hdsb")
    with pytest.raises(InvalidArgument, match="sink_tokens"):
        fa.forward(q, k, k, o, b, h, h, s, s, d, sink_tokens=1)
    q32 = put(dev, rand(rng, b, h, s, d), DType.F32)
    with pytest.raises(InvalidArgument, match="mask must be one of"):
        dev.cudnn().multihead_attn_fwd_f32(q32, q32, q32, q32, b, s, s, h, h, d, mask="diagonal")
    cache = put(dev, rand(rng, 2, h, 4, d))  # two blocks of four tokens
    table = put(dev, np.array([[0, 5]]), DType.I32)
    with pytest.raises(InvalidArgument, match="names block 5"):
        fa.forward(q, cache, cache, o, b, h, h, s, 8, d, block_table=table,
                   context_lens=put(dev, np.array([8]), DType.I32), block_size=4)
    with pytest.raises(InvalidArgument, match="cu_seqlens"):
        fa.forward(q, k, k, o, 2, h, h, s, s, d, layout="thd",
                   cu_seqlens_q=put(dev, np.array([0, 3, 1]), DType.I32),
                   cu_seqlens_kv=put(dev, np.array([0, 2, 4]), DType.I32))
    assert fa.forward(q, k, k, o, b, h, h, s, s, d) == "numpy"  # still serving


# ------------------------------------------------------------------------ GPU


@pytest.fixture(scope="module")
def gpu() -> Iterator[tuple[Any, Any]]:
    with System.open("attention-gpu") as system:
        yield system.spawn_device(mock=False), system.spawn_device(mock=True)


def _torch() -> Any:
    return pytest.importorskip("torch")


def _sdpa_torch(q: Arr, k: Arr, v: Arr, causal: bool, dtype: Any) -> Arr:
    torch = _torch()
    t = [torch.tensor(x, device="cuda", dtype=dtype) for x in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(
        *t, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return np.asarray(out.float().cpu().numpy(), dtype=np.float64)


GPU_TOL = {DType.BF16: 2e-2, DType.F16: 3e-3, DType.F32: 1e-5}
"""Normwise relative error bounds of a forward on the GPU (a backward gets twice)."""


def close(got: Arr, want: Arr, tol: float) -> None:
    """Assert the normwise relative error of ``got`` is below ``tol``."""
    err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    assert err < tol, f"relative error {err:.2e} >= {tol:.0e}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [DType.BF16, DType.F16])
@pytest.mark.parametrize(("hq", "hkv", "causal"), [(8, 8, False), (8, 8, True), (8, 2, True)])
def test_gpu_forward_backward_vs_cpu_and_torch(gpu: tuple[Any, Any], dtype: DType, hq: int,
                                               hkv: int, causal: bool) -> None:
    cuda, cpu = gpu
    if dtype is DType.BF16:
        pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(8)
    b, s, d = 2, 128, 64
    q, k, v, do = (rand(rng, b, h, s, d).astype(dtype.numpy).astype(np.float64)
                   for h in (hq, hkv, hkv, hq))
    fa = cuda.flashattn()
    bufs = [put(cuda, x, dtype) for x in (q, k, v, do)]
    o, stats = cuda.allocate(q.size, dtype), cuda.allocate_f32(b * hq * s)
    assert fa.forward(*bufs[:3], o, b, hq, hkv, s, s, d, stats=stats,
                      causal=causal) == "cudnn-graph"
    want, lse = reference_cpu(cpu, q, k, v, do, b, hq, hkv, s, d, causal)
    tol = GPU_TOL[dtype]
    close(get(cuda, o, q.shape), want[0], tol)
    close(get(cuda, stats, lse.shape), lse, 1e-3)
    torch_dtype = {DType.BF16: _torch().bfloat16, DType.F16: _torch().float16}[dtype]
    close(get(cuda, o, q.shape), _sdpa_torch(q, k, v, causal, torch_dtype), tol)
    grads = [cuda.allocate(x.size, dtype) for x in (q, k, v)]
    assert fa.backward(*bufs[:3], o, bufs[3], stats, *grads, b, hq, hkv, s, s, d,
                       causal=causal) == "cudnn-graph"
    for buf, x, g in zip(grads, (q, k, v), want[1:], strict=True):
        close(get(cuda, buf, x.shape), g, 2 * tol)


def reference_cpu(cpu: Any, q: Arr, k: Arr, v: Arr, do: Arr, b: int, hq: int, hkv: int, s: int,
                  d: int, causal: bool, **mask: Any) -> tuple[list[Arr], Arr]:
    """Forward and backward on the CPU backend in float64: ``([o, dq, dk, dv], lse)``."""
    fa = cpu.flashattn()
    bufs = [put(cpu, x) for x in (q, k, v, do)]
    o, stats = cpu.allocate(q.size, DType.F64), cpu.allocate_f32(b * hq * s)
    fa.forward(*bufs[:3], o, b, hq, hkv, s, s, d, stats=stats, causal=causal, **mask)
    grads = [cpu.allocate(x.size, DType.F64) for x in (q, k, v)]
    fa.backward(*bufs[:3], o, bufs[3], stats, *grads, b, hq, hkv, s, s, d, causal=causal, **mask)
    outs = [get(cpu, o, q.shape)] + [get(cpu, g, x.shape) for g, x in zip(grads, (q, k, v),
                                                                          strict=True)]
    return outs, get(cpu, stats, (b, hq, s))


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "mask", "path"), [
    (DType.F16, {"causal": True, "window": 16}, "cudnn-graph"),
    (DType.F16, {"causal": True, "alibi": True}, "cudnn-graph"),
    (DType.F16, {"causal": True, "window": 16, "sink_tokens": 4}, "cupy-composed"),
    (DType.F32, {"causal": True}, "cupy-composed"),
], ids=str)
def test_gpu_masks_and_composed_path_vs_cpu(gpu: tuple[Any, Any], dtype: DType,
                                            mask: dict[str, Any], path: str) -> None:
    cuda, cpu = gpu
    rng = np.random.default_rng(9)
    b, hq, hkv, s, d = 2, 4, 2, 96, 64
    q, k, v, do = (rand(rng, b, h, s, d).astype(dtype.numpy).astype(np.float64)
                   for h in (hq, hkv, hkv, hq))
    fa = cuda.flashattn()
    bufs = [put(cuda, x, dtype) for x in (q, k, v, do)]
    o, stats = cuda.allocate(q.size, dtype), cuda.allocate_f32(b * hq * s)
    assert fa.forward(*bufs[:3], o, b, hq, hkv, s, s, d, stats=stats, **mask) == path
    want, _ = reference_cpu(cpu, q, k, v, do, b, hq, hkv, s, d, **mask)
    tol = GPU_TOL[dtype]
    close(get(cuda, o, q.shape), want[0], tol)
    grads = [cuda.allocate(x.size, dtype) for x in (q, k, v)]
    assert fa.backward(*bufs[:3], o, bufs[3], stats, *grads, b, hq, hkv, s, s, d, **mask) == path
    for buf, x, g in zip(grads, (q, k, v), want[1:], strict=True):
        close(get(cuda, buf, x.shape), g, 2 * tol)


@pytest.mark.gpu
def test_gpu_attention_awaited_again_computes_each_calls_data(gpu: tuple[Any, Any]) -> None:
    """A forward and backward that ran once are launched from the caller's event loop (their
    graphs are built): three rounds, 3 calls in flight each on its own data, new data each
    round, against the CPU backend in float64."""
    import asyncio

    cuda, cpu = gpu
    rng = np.random.default_rng(12)
    dtype, (b, hq, hkv, s, d) = DType.F16, (2, 4, 2, 64, 64)
    fa = cuda.flashattn()
    shapes = [(b, h, s, d) for h in (hq, hkv, hkv, hq)]
    sets = [[cuda.allocate(int(np.prod(shape)), dtype) for shape in shapes] for _ in range(3)]
    outs = [(cuda.allocate(b * hq * s * d, dtype), cuda.allocate_f32(b * hq * s),
             [cuda.allocate(int(np.prod(shape)), dtype) for shape in shapes[:3]]) for _ in sets]

    async def one_round() -> list[str]:
        paths = await asyncio.gather(*(fa.forward_async(
            q, k, v, o, b, hq, hkv, s, s, d, stats=stats, causal=True)
            for (q, k, v, _), (o, stats, _) in zip(sets, outs, strict=True)))
        return paths + await asyncio.gather(*(fa.backward_async(
            q, k, v, o, do, stats, *grads, b, hq, hkv, s, s, d, causal=True)
            for (q, k, v, do), (o, stats, grads) in zip(sets, outs, strict=True)))

    for _ in range(3):
        datas = [[rand(rng, *shape).astype(dtype.numpy).astype(np.float64) for shape in shapes]
                 for _ in sets]
        for bufs, data in zip(sets, datas, strict=True):
            for buf, x in zip(bufs, data, strict=True):
                cuda.copy_from_numpy(buf, x.reshape(-1).astype(dtype.numpy))
        assert set(asyncio.run(one_round())) == {"cudnn-graph"}
        for data, (o, _, grads) in zip(datas, outs, strict=True):
            want, _ = reference_cpu(cpu, *data, b, hq, hkv, s, d, True)
            close(get(cuda, o, data[0].shape), want[0], GPU_TOL[dtype])
            for buf, x, g in zip(grads, data[:3], want[1:], strict=True):
                close(get(cuda, buf, x.shape), g, 2 * GPU_TOL[dtype])


@pytest.mark.gpu
def test_gpu_paged_and_ragged_equal_the_reference(gpu: tuple[Any, Any]) -> None:
    cuda = gpu[0]
    rng = np.random.default_rng(10)
    dtype = DType.F16
    b, hq, hkv, d, bs, seq_kv = 4, 8, 2, 64, 64, 512
    per = seq_kv // bs
    blocks = b * per + 3
    ctx = [512, 300, 64, 1]
    q = rand(rng, b, hq, 1, d).astype(dtype.numpy).astype(np.float64)
    cache_k, cache_v = (rand(rng, blocks, hkv, bs, d).astype(dtype.numpy).astype(np.float64)
                        for _ in range(2))
    table = rng.permutation(blocks)[:b * per].reshape(b, per)
    dense_k = cache_k[table].transpose(0, 2, 1, 3, 4).reshape(b, hkv, seq_kv, d)
    dense_v = cache_v[table].transpose(0, 2, 1, 3, 4).reshape(b, hkv, seq_kv, d)
    fa = cuda.flashattn()
    o = cuda.allocate(q.size, dtype)
    ran = fa.forward(put(cuda, q, dtype), put(cuda, cache_k, dtype), put(cuda, cache_v, dtype),
                     o, b, hq, hkv, 1, seq_kv, d, block_table=put(cuda, table, DType.I32),
                     context_lens=put(cuda, np.array(ctx), DType.I32), block_size=bs)
    assert ran == "cudnn-graph"
    want, _ = reference(q, dense_k, dense_v, [1] * b, ctx)
    close(get(cuda, o, q.shape), want, GPU_TOL[dtype])
    bad = table.copy()
    bad[1, 0] = blocks  # one past the cache, in a block sequence 1 uses
    before = get(cuda, o, q.shape)
    call = functools.partial(
        fa.forward, put(cuda, q, dtype), put(cuda, cache_k, dtype), put(cuda, cache_v, dtype), o,
        b, hq, hkv, 1, seq_kv, d, block_table=put(cuda, bad, DType.I32),
        context_lens=put(cuda, np.array(ctx), DType.I32), block_size=bs)
    with pytest.raises(InvalidArgument, match="names block"):
        call()
    np.testing.assert_array_equal(get(cuda, o, q.shape), before)  # nothing written
    assert call(check_table=False) == "cudnn-graph"  # trusted: clamped on the device
    lens = [100, 37, 128]
    cu = put(cuda, np.cumsum([0, *lens]), DType.I32)
    x = [rand(rng, 3, h, 128, d).astype(dtype.numpy).astype(np.float64) for h in (hq, hkv, hkv)]
    packed = [put(cuda, _pack(t, lens), dtype) for t in x]
    o = cuda.allocate(sum(lens) * hq * d, dtype)
    fa.forward(*packed, o, 3, hq, hkv, 128, 128, d, layout="thd", cu_seqlens_q=cu,
               cu_seqlens_kv=cu, causal=True)
    want, _ = reference(*x, lens, lens, causal=True)
    close(get(cuda, o, (sum(lens), hq, d)), _pack(want, lens), GPU_TOL[dtype])


@pytest.mark.gpu
def test_gpu_multihead_attention_f32_and_capability(gpu: tuple[Any, Any]) -> None:
    cuda, cpu = gpu
    rng = np.random.default_rng(11)
    b, hq, hkv, s, d = 2, 4, 4, 32, 16
    q, k, v = (rand(rng, b, h, s, d).astype(np.float32).astype(np.float64)
               for h in (hq, hkv, hkv))
    outs = []
    for dev in (cuda, cpu):
        o = dev.allocate_f32(q.size)
        dev.cudnn().multihead_attn_fwd_f32(*(put(dev, x, DType.F32) for x in (q, k, v)), o, b, s,
                                           s, hq, hkv, d, mask="causal_sliding_window", window=8)
        outs.append(get(dev, o, q.shape))
    close(outs[0], outs[1], GPU_TOL[DType.F32])
    assert cuda.flashattn().forward_f16("sm_90", 128, 4) == "cudnn-graph"
    assert cuda.flashattn().forward_f16(sink_tokens=4, mask="causal_sliding_window",
                                        window=64) == "cupy-composed"


@pytest.mark.gpu
def test_gpu_bshd_and_ragged_backward_vs_cpu(gpu: tuple[Any, Any]) -> None:
    cuda, cpu = gpu
    rng = np.random.default_rng(12)
    dtype, b, hq, hkv, d = DType.F16, 3, 8, 2, 64
    lens_q, lens_kv = [70, 128, 5], [90, 128, 40]
    sq = skv = 128
    q, do = (rand(rng, b, hq, sq, d).astype(np.float16).astype(np.float64) for _ in range(2))
    k, v = (rand(rng, b, hkv, skv, d).astype(np.float16).astype(np.float64) for _ in range(2))
    cases = [("bshd", [sq] * b, [skv] * b), ("thd", lens_q, lens_kv)]
    for layout, lq, lkv in cases:
        results = []
        for dev, dt in ((cuda, dtype), (cpu, DType.F64)):
            fa = dev.flashattn()
            if layout == "thd":
                stored = [_pack(q, lq), _pack(k, lkv), _pack(v, lkv), _pack(do, lq)]
                extra = {"cu_seqlens_q": put(dev, np.cumsum([0, *lq]), DType.I32),
                         "cu_seqlens_kv": put(dev, np.cumsum([0, *lkv]), DType.I32)}
            else:
                stored = [x.transpose(0, 2, 1, 3) for x in (q, k, v, do)]
                extra = {}
            bufs = [put(dev, x, dt) for x in stored]
            o, stats = dev.allocate(stored[0].size, dt), dev.allocate_f32(b * hq * sq)
            grads = [dev.allocate(x.size, dt) for x in stored[:3]]
            fa.forward(*bufs[:3], o, b, hq, hkv, sq, skv, d, stats=stats, causal=True,
                       layout=layout, **extra)
            fa.backward(*bufs[:3], o, bufs[3], stats, *grads, b, hq, hkv, sq, skv, d,
                        causal=True, layout=layout, **extra)
            shapes = [stored[0].shape] + [x.shape for x in stored[:3]]
            results.append([get(dev, g, shape) for g, shape in zip([o, *grads], shapes,
                                                                   strict=True)])
        for got, want in zip(*results, strict=True):
            close(got, want, 2 * GPU_TOL[dtype])
