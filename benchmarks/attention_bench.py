"""Attention on the GPU: ``FlashAttn`` (cuDNN SDPA) against torch's flash backend; paged decode.

1. Forward and backward, bf16, batch 8, 16 heads, head_dim 128, sequence 1k-8k
   (16k with ``--long``), causal and not: our device call (async calls
   pipelined, wall time per call, the median of 5 bursts) against
   ``torch.nn.functional.scaled_dot_product_attention`` under
   ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` (CUDA events). TFLOP/s count
   ``4 * b * h * s * s * d`` for the forward, half of it when causal, and 2.5x
   the forward for the backward. Goal: ours >= 95% of torch.
2. Decode with a paged KV cache: batch 32, 8k context, one query token, 32
   query heads over 8 key/value heads, head_dim 128, blocks of 64 tokens in a
   shuffled block table, against the same call on a contiguous cache. Goal:
   paged within 1.2x of contiguous per step. "paged" is a decode loop's call
   (``check_table=False``: tables it trusts, the calls stay pipelined);
   "paged, checked" the default, which reads the table back and checks it
   before each step.

    python benchmarks/attention_bench.py [--long] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import add_quick, print_table, require_cuda, write_json

from atomr_accel import DType, System

B, H, D = 8, 16, 128
REPS = {1024: 40, 2048: 20, 4096: 10, 8192: 6, 16384: 3}


def fill(dev: Any, n: int, rng: np.random.Generator) -> tuple[Any, str]:
    """A bf16 buffer of ``n`` elements: standard normal when ml_dtypes can make the host
    array, else zero-filled (attention's cost does not depend on the values)."""
    buf = dev.allocate(n, DType.BF16)
    try:
        import ml_dtypes
    except ImportError:
        return buf, "zeros"
    dev.copy_from_numpy(buf, rng.standard_normal(n, dtype=np.float32).astype(ml_dtypes.bfloat16))
    return buf, "random"


BURSTS = 5
"""How many bursts ``per_call`` times (a burst lasts 4 to 60 ms: one alone is at the mercy of
a stray pause)."""


def per_call(make: Callable[[], Any], reps: int) -> float:
    """Seconds per call of ``reps`` async calls in flight together: the median over
    ``BURSTS`` bursts (after one warm call)."""

    async def run() -> float:
        await make()
        times = []
        for _ in range(BURSTS):
            start = time.perf_counter()
            await asyncio.gather(*(make() for _ in range(reps)))
            times.append((time.perf_counter() - start) / reps)
        return statistics.median(times)

    return asyncio.run(run())


def torch_seconds(torch: Any, fn: Callable[[], Any], reps: int) -> float:
    """Seconds per call of ``fn`` on the current stream: the median over ``BURSTS`` bursts
    of ``reps`` calls (CUDA events, after a warm call)."""
    fn()
    times = []
    for _ in range(BURSTS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)) / 1e3 / reps)
    return statistics.median(times)


def direct_cudnn(torch: Any, s: int, causal: bool, reps: int) -> tuple[float, float]:
    """Seconds per forward and per backward of the same cuDNN graphs executed directly on
    torch tensors (no device actor): the library's own floor, CUDA events."""
    import cudnn

    from atomr_accel.backends.cuda._attention import Config, _build
    from atomr_accel.core.ops._attention import AttnLayout

    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    tensors = [torch.randn(B, H, s, D, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    stats = torch.empty(B, H, s, device="cuda", dtype=torch.float32)
    q, k, v, o, do, dq, dk, dv = tensors
    times = []
    for backward, data in ((False, (q, k, v, o, stats)),
                           (True, (q, k, v, o, stats, do, dq, dk, dv))):
        cfg = Config(backward, DType.BF16, B, H, H, s, s, D, AttnLayout.BHSD, causal, 0, False,
                     D ** -0.5, True)
        built = _build(cfg, handle)
        ws = torch.empty(max(built.graph.get_workspace_size(), 1), device="cuda",
                         dtype=torch.uint8)
        pack = dict(zip(built.tensors, [t.data_ptr() for t in data], strict=True))
        times.append(torch_seconds(torch, lambda built=built, pack=pack, ws=ws: (
            built.graph.execute(pack, ws.data_ptr(), handle=handle)), reps))
    return times[0], times[1]


def one_length(dev: Any, torch: Any, s: int, rng: np.random.Generator,
               ) -> tuple[list[dict[str, Any]], str]:
    """Forward and backward of ours and torch's flash attention at sequence length ``s``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fa = dev.flashattn()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    n = B * H * s * D
    (q, data), (k, _), (v, _), (do, _) = (fill(dev, n, rng) for _ in range(4))
    o, dq, dk, dv = (dev.allocate(n, DType.BF16) for _ in range(4))
    stats = dev.allocate_f32(B * H * s)
    make = torch.randn if data == "random" else torch.zeros
    tq, tk, tv, tdo = (make(B, H, s, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (tq, tk, tv):
        t.requires_grad_(True)
    rows = []
    for causal in (False, True):
        flops = 4.0 * B * H * s * s * D / (2 if causal else 1)
        reps = REPS[s]
        paths = {fa.forward(q, k, v, o, B, H, H, s, s, D, stats=stats, causal=causal),
                 fa.backward(q, k, v, o, do, stats, dq, dk, dv, B, H, H, s, s, D, causal=causal)}
        ours_f = per_call(lambda causal=causal: fa.forward_async(
            q, k, v, o, B, H, H, s, s, D, stats=stats, causal=causal), reps)
        ours_b = per_call(lambda causal=causal: fa.backward_async(
            q, k, v, o, do, stats, dq, dk, dv, B, H, H, s, s, D, causal=causal), reps)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            torch_f = torch_seconds(torch, lambda causal=causal: sdpa(
                tq, tk, tv, is_causal=causal), reps)
            out = sdpa(tq, tk, tv, is_causal=causal)
            torch_b = torch_seconds(torch, lambda out=out: torch.autograd.grad(
                out, (tq, tk, tv), tdo, retain_graph=True), reps)
        direct_f, direct_b = direct_cudnn(torch, s, causal, reps)
        for kind, ours, theirs, direct, work in (("fwd", ours_f, torch_f, direct_f, flops),
                                                 ("bwd", ours_b, torch_b, direct_b, 2.5 * flops)):
            rows.append({"seq": s, "causal": causal, "pass": kind, "ours_ms": ours * 1e3,
                         "torch_ms": theirs * 1e3, "cudnn_direct_ms": direct * 1e3,
                         "ours_tflops": work / ours / 1e12,
                         "torch_tflops": work / theirs / 1e12, "ratio": theirs / ours,
                         "path": "/".join(sorted(paths))})
    for buf in (q, k, v, do, o, dq, dk, dv, stats):
        dev.free(buf)
    return rows, data


def training(dev: Any, torch: Any, seqs: list[int]) -> tuple[list[dict[str, Any]], str]:
    """Every sequence length's rows (``one_length``) and whether the data were random."""
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    data = "random"
    for s in seqs:
        more, data = one_length(dev, torch, s, rng)
        rows += more
        for r in more:  # progress, in case the run is cut short
            print(f"seq {s} causal {r['causal']} {r['pass']}: ours {r['ours_tflops']:.0f} "
                  f"torch {r['torch_tflops']:.0f} TFLOP/s, direct {r['cudnn_direct_ms']:.3f} ms",
                  flush=True)
        torch.cuda.empty_cache()
    return rows, data


def decode(dev: Any) -> dict[str, Any]:
    """Per-step latency of one-token decode over a paged and a contiguous 8k cache."""
    b, hq, hkv, ctx, bs = 32, 32, 8, 8192, 64
    per = ctx // bs
    rng = np.random.default_rng(1)
    fa = dev.flashattn()
    q, _ = fill(dev, b * hq * D, rng)
    o = dev.allocate(b * hq * D, DType.BF16)
    n = b * hkv * ctx * D
    (k, _), (v, _) = fill(dev, n, rng), fill(dev, n, rng)
    table = dev.allocate(b * per, DType.I32)
    dev.copy_from_numpy(table, rng.permutation(b * per).astype(np.int32))
    lens = dev.allocate(b, DType.I32)
    dev.copy_from_numpy(lens, np.full(b, ctx, dtype=np.int32))
    paged = {"block_table": table, "context_lens": lens, "block_size": bs}
    runs = {"contiguous": {}, "paged": paged | {"check_table": False}, "paged, checked": paged}
    out: dict[str, Any] = {"batch": b, "heads_q": hq, "heads_kv": hkv, "context": ctx,
                           "block_size": bs}
    for name, options in runs.items():
        out[f"{name}_path"] = fa.forward(q, k, v, o, b, hq, hkv, 1, ctx, D, **options)
        out[f"{name}_us"] = per_call(lambda options=options: fa.forward_async(
            q, k, v, o, b, hq, hkv, 1, ctx, D, **options), 200) * 1e6
        began = time.perf_counter()
        for _ in range(50):
            fa.forward(q, k, v, o, b, hq, hkv, 1, ctx, D, **options)
        out[f"{name}_blocking_us"] = (time.perf_counter() - began) / 50 * 1e6
    out["ratio"] = out["paged_us"] / out["contiguous_us"]
    for buf in (q, o, k, v, table, lens):
        dev.free(buf)
    return out


def paths(dev: Any) -> list[list[str]]:
    """The path each feature takes here (bf16 unless named; 2 x 8/2 heads x 256 x 128)."""
    fa, b, hq, hkv, s, d = dev.flashattn(), 2, 8, 2, 256, 128
    rng = np.random.default_rng(2)
    (q, _), (k, _), (v, _), (do, _) = (fill(dev, b * h * s * d, rng) for h in (hq, hkv, hkv, hq))
    out_buf, dq, dk, dv = (dev.allocate(b * h * s * d, DType.BF16) for h in (hq, hq, hkv, hkv))
    stats = dev.allocate_f32(b * hq * s)
    cu = dev.allocate(b + 1, DType.I32)
    dev.copy_from_numpy(cu, np.array([0, 200, 456], dtype=np.int32))
    ragged = {"layout": "thd", "cu_seqlens_q": cu, "cu_seqlens_kv": cu}
    cases = {"causal": {"causal": True}, "bshd causal": {"causal": True, "layout": "bshd"},
             "window 64": {"window": 64}, "causal window 64": {"causal": True, "window": 64},
             "alibi causal": {"causal": True, "alibi": True}, "alibi": {"alibi": True},
             "sinks 4, window 64": {"causal": True, "window": 64, "sink_tokens": 4},
             "ragged causal": ragged | {"causal": True}}
    out = []
    for name, options in cases.items():
        row = [name]
        for run in (lambda o=options: fa.forward(q, k, v, out_buf, b, hq, hkv, s, s, d,
                                                 stats=stats, **o),
                    lambda o=options: fa.backward(q, k, v, out_buf, do, stats, dq, dk, dv, b, hq,
                                                  hkv, s, s, d, **o)):
            try:
                row.append(run())
            except Exception as exc:  # a failure is a finding of this table
                row.append(f"{type(exc).__name__}: {str(exc)[:60]}")
        out.append(row)
    for buf in (q, k, v, do, out_buf, dq, dk, dv, stats, cu):
        dev.free(buf)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="add sequence 16k")
    parser.add_argument("--json", default="attention_bench.json")
    add_quick(parser)
    args = parser.parse_args()
    require_cuda()
    import torch

    seqs = [1024, 2048, 4096, 8192] + ([16384] if args.long else [])
    began = time.perf_counter()
    with System.open("attention-bench") as system:
        dev = system.spawn_device(mock=False)
        coverage = paths(dev)
        print_table("Path per feature (bf16, batch 2, 8/2 heads, 256 tokens, d 128)",
                    ["feature", "forward", "backward"], coverage)
        steps = decode(dev)
        print_table("Decode, batch 32, 8k context, 32/8 heads, d 128, blocks of 64 (per step, "
                    "us; goal paged <= 1.2x contiguous)",
                    ["cache", "pipelined us", "blocking us", "path"],
                    [[name, steps[f"{name}_us"], steps[f"{name}_blocking_us"],
                      steps[f"{name}_path"]] for name in ("contiguous", "paged", "paged, checked")]
                    + [["ratio", steps["ratio"], "", ""]])
        rows, data = training(dev, torch, seqs)
    print_table(f"Attention bf16, batch {B}, {H} heads, head_dim {D} ({data} data): ours vs "
                "torch flash (TFLOP/s; ratio = ours / torch, goal >= 0.95)",
                ["seq", "causal", "pass", "ours ms", "torch ms", "cudnn direct ms", "ours TF/s",
                 "torch TF/s", "ratio", "path"],
                [[r["seq"], r["causal"], r["pass"], r["ours_ms"], r["torch_ms"],
                  r["cudnn_direct_ms"], r["ours_tflops"], r["torch_tflops"], r["ratio"],
                  r["path"]] for r in rows])
    write_json(args.json, {"training": rows, "decode": steps, "data": data, "paths": coverage,
                           "seconds": time.perf_counter() - began})


if __name__ == "__main__":
    main()
