"""``dev.cutlass()`` against cuBLAS: a bf16 GEMM of 8192^3, and a grouped GEMM of 64 mixed
small problems against 64 separate calls.

GEMM (bf16, f32 accumulation, row-major): after warm-up, the median over
``--rounds`` rounds of ``--reps`` calls each, every path in turn within a round (a
GPU that sustains a large GEMM clocks down as it warms, so paths timed one
after another would each see another clock) of

1. cuBLAS: ``torch.matmul`` timed back to back with CUDA events, and blocking
   (``torch.matmul`` then ``torch.cuda.synchronize``, wall time of each call);
2. the CUTLASS kernel alone: our compiled kernel called through ctypes on torch's
   stream, CUDA events (what the kernel itself achieves);
3. ours, blocking: ``Cutlass.gemm``, wall time of each call (it returns when ``D``
   is on the device), and ours, async: ``--inflight`` ``gemm_async`` calls gathered,
   wall time per call.

TFLOP/s count ``2 m n k``. Goal: ours >= 90% of cuBLAS.

Grouped (bf16): 64 problems, ``m`` in 64..512, ``n`` and ``k`` in {256, 512, 1024}
(seeded). Ours: one ``Cutlass.grouped_gemm`` (one kernel launch) per group, blocking
wall time; against 64 separate calls gathered as async calls through our ``Blas``
(``matmul``; cuBLAS has no bf16 there, so f32 data), through our ``BlasLt`` (bf16,
cuBLASLt), and 64 ``torch.matmul`` calls (bf16, events around the 64). Goal: ours >=
1.5x faster than the 64 calls through ``Blas``. Results are checked against torch.

fp8 (e4m3 x e4m3 -> bf16, f32 accumulation, ``--size``^3): ``torch._scaled_mm``
(cuBLASLt; its default accumulation, and ``use_fast_accum=True``) and our fp8
kernel alone by CUDA events, ``Cutlass.gemm_fp8`` blocking and async by wall
time; TFLOP/s and the ratio to ``torch._scaled_mm``; the result is checked
against it. ``--fp8-candidates`` also times other fp8 kernels alone (tiles,
clusters, the pingpong and fast-accumulation schedules).

Families (``--family-size``^3, default 4096, and one odd size, ``--family-size`` - 1 x
+ 1 x - 3): each kernel alone by CUDA events against ``torch.matmul`` (cuBLAS; f32 with
TF32 allowed, as ours computes in TF32): f16, bf16 and f32 with the ``sm90`` (Hopper)
and the ``sm80`` (Ampere, forced with ``family="sm80"``) templates, f64 (``sm80``, DMMA),
and the odd size's narrow-load ``sm80`` kernels (bf16, f32); each result's largest error
relative to the largest value of the float64 product (``torch.matmul`` of the inputs
in float64).

    python benchmarks/cutlass_bench.py [--size 8192] [--reps 10] [--rounds 3] [--json PATH]
        [--sections gemm,grouped,fp8,families] [--family-size 4096]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

import ml_dtypes
import numpy as np
import torch
from _report import add_quick, pipelined, print_table, require_cuda, wall_samples, write_json

from atomr_accel import DType, System
from atomr_accel.backends._cutlass_build import library
from atomr_accel.cutlass import (
    KernelPlan,
    build_kernels,
    gemm_fp8_plan,
    gemm_plan,
    grouped_plan,
)


def events(fn: Callable[[], Any], reps: int, warm: int) -> list[float]:
    """Seconds of each of ``reps`` back-to-back calls of ``fn`` by CUDA events around each."""
    for _ in range(warm):
        fn()
    marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(reps)]
    for start, end in marks:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in marks]




def upload(dev: Any, t: torch.Tensor, dtype: DType) -> Any:
    """A device buffer holding ``t``'s values in ``dtype``."""
    host = t.float().cpu().numpy().reshape(-1)
    buf = dev.allocate(host.size, dtype)
    dev.copy_from_numpy(buf, host.astype(ml_dtypes.bfloat16) if dtype is DType.BF16 else host)
    return buf


def gemm_section(dev: Any, size: int, reps: int, warm: int, inflight: int, rounds: int,
                 ) -> tuple[list[list[Any]], dict[str, Any]]:
    m = n = k = size
    flops = 2.0 * m * n * k
    ta = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    tb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    tc = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    a, b = upload(dev, ta, DType.BF16), upload(dev, tb, DType.BF16)
    d = dev.allocate(m * n, DType.BF16)
    cl = dev.cutlass()
    plan = gemm_plan(DType.BF16, m, n, k)
    kernel = library(plan)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.empty(max(1, kernel.lib.atomr_workspace(m, n, k, sm)), dtype=torch.uint8,
                     device="cuda")
    td = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def direct() -> None:
        status = kernel.lib.atomr_run(m, n, k, ta.data_ptr(), tb.data_ptr(), td.data_ptr(),
                                      td.data_ptr(), None, 1.0, 0.0, 0, ws.data_ptr(), sm,
                                      torch.cuda.current_stream().cuda_stream)
        assert status == 0, status

    def cublas_blocking() -> None:
        torch.matmul(ta, tb, out=tc)
        torch.cuda.synchronize()

    paths: dict[str, Callable[[], list[float]]] = {
        "cuBLAS (torch.matmul), events": lambda: events(
            lambda: torch.matmul(ta, tb, out=tc), reps, warm),
        "cuBLAS, blocking (matmul + synchronize)": lambda: wall_samples(
            cublas_blocking, reps, warm),
        "CUTLASS kernel alone, events": lambda: events(direct, reps, warm),
        "ours, blocking (Cutlass.gemm)": lambda: wall_samples(
            lambda: cl.gemm(a, b, d, m, n, k, timeout_secs=120), reps, warm),
        "ours, async": lambda: pipelined(
            lambda: cl.gemm_async(a, b, d, m, n, k, timeout_secs=120), inflight, reps, warm),
    }
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):  # in turn, so each path sees the GPU as warm (and as clocked)
        for name, run in paths.items():
            samples[name] += run()
    want = tc.float()
    got = torch.tensor(np.asarray(dev.copy_to_numpy(d), np.float32), device="cuda").view(m, n)
    error = float(((got - want).abs().max() / want.abs().max()).item())
    direct_error = float(((td.float() - want).abs().max() / want.abs().max()).item())
    base = statistics.median(samples["cuBLAS (torch.matmul), events"])
    rows = []
    for name, times in samples.items():
        med = statistics.median(times)
        rows.append([name, med * 1e3, flops / med / 1e12, base / med])
    meta = {"plan": plan.name, "stages": kernel.stages, "smem_bytes": kernel.smem_bytes,
            "max_rel_error_vs_cublas": error, "direct_max_rel_error": direct_error,
            "samples_s": samples}
    return rows, meta


def grouped_section(dev: Any, reps: int, warm: int) -> tuple[list[list[Any]], dict[str, Any]]:
    rng = np.random.default_rng(14)
    problems = [(int(rng.integers(64, 513)), int(rng.choice([256, 512, 1024])),
                 int(rng.choice([256, 512, 1024]))) for _ in range(64)]
    flops = sum(2.0 * m * n * k for m, n, k in problems)
    ta = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for m, _, k in problems]
    tb = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for _, n, k in problems]
    tc = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for m, n, _ in problems]
    cl, blas, lt = dev.cutlass(), dev.blas(), dev.blaslt()
    a = upload(dev, torch.cat([x.reshape(-1) for x in ta]), DType.BF16)
    b = upload(dev, torch.cat([x.reshape(-1) for x in tb]), DType.BF16)
    total = sum(m * n for m, n, _ in problems)
    d = dev.allocate(total, DType.BF16)
    # per-problem buffers for the separate calls (bf16 for BlasLt, f32 for Blas)
    triples = list(zip(ta, tb, problems, strict=True))
    lt_bufs = [(upload(dev, x, DType.BF16), upload(dev, y, DType.BF16),
                dev.allocate(m * n, DType.BF16)) for x, y, (m, n, _) in triples]
    f32_bufs = [(upload(dev, x, DType.F32), upload(dev, y, DType.F32),
                 dev.allocate(m * n, DType.F32)) for x, y, (m, n, _) in triples]

    async def separate(calls: Callable[[int], Coroutine[Any, Any, Any]]) -> None:
        await asyncio.gather(*(calls(i) for i in range(len(problems))))

    def blas_call(i: int) -> Coroutine[Any, Any, Any]:
        (m, n, k), (x, y, z) = problems[i], f32_bufs[i]
        return blas.matmul_async(x, y, z, m, n, k, timeout_secs=120)

    def lt_call(i: int) -> Coroutine[Any, Any, Any]:
        (m, n, k), (x, y, z) = problems[i], lt_bufs[i]
        return lt.matmul_async(x, y, z, m, n, k, timeout_secs=120)

    def torch_all() -> None:
        for x, y, z in zip(ta, tb, tc, strict=True):
            torch.matmul(x, y, out=z)

    samples = {
        "ours: 1 grouped launch, blocking": wall_samples(
            lambda: cl.grouped_gemm(a, b, d, problems, timeout_secs=120), reps, warm),
        "64 calls through our Blas (f32), async gathered": wall_samples(
            lambda: asyncio.run(separate(blas_call)), reps, warm),
        "64 calls through our BlasLt (bf16), async gathered": wall_samples(
            lambda: asyncio.run(separate(lt_call)), reps, warm),
        "64 torch.matmul (bf16, cuBLAS direct), events": events(torch_all, reps, warm),
    }
    torch.cuda.synchronize()
    got = np.asarray(dev.copy_to_numpy(d), np.float32)
    worst, start = 0.0, 0
    for (m, n, _), z in zip(problems, tc, strict=True):
        want = z.float().cpu().numpy()
        part = got[start: start + m * n].reshape(m, n)
        worst = max(worst, float(np.abs(part - want).max() / np.abs(want).max()))
        start += m * n
    ours = statistics.median(samples["ours: 1 grouped launch, blocking"])
    rows = []
    for name, times in samples.items():
        med = statistics.median(times)
        rows.append([name, med * 1e3, flops / med / 1e12, med / ours])
    meta = {"problems": problems, "max_rel_error_vs_torch": worst, "samples_s": samples}
    return rows, meta


def fp8_candidates(size: int) -> list[KernelPlan]:
    """Other fp8 kernels than the plan's, timed alone with ``--fp8-candidates`` (what the
    plan's choice of tile, cluster and schedule rests on)."""
    base = gemm_fp8_plan(DType.BF16, size, size, size)
    return [
        dataclasses.replace(base, tile=(128, 256, 128), cluster=(2, 1, 1), stages=4),
        dataclasses.replace(base, tile=(128, 128, 128), cluster=(1, 2, 1), stages=6),
        dataclasses.replace(base, tile=(64, 128, 128), cluster=(1, 2, 1), schedule="pingpong",
                            stages=8),
        gemm_fp8_plan(DType.BF16, size, size, size, fast_accum=True),
    ]


def _short(plan: KernelPlan) -> str:
    return (f"{'x'.join(map(str, plan.tile))} c{'x'.join(map(str, plan.cluster[:2]))} "
            f"{plan.schedule}")


def fp8_section(dev: Any, size: int, reps: int, warm: int, inflight: int,
                candidates: list[KernelPlan]) -> tuple[list[list[Any]], dict[str, Any]]:
    m = n = k = size
    flops = 2.0 * m * n * k
    e4m3 = torch.float8_e4m3fn
    ta = torch.randn(m, k, device="cuda").to(e4m3)
    tb = torch.randn(n, k, device="cuda").to(e4m3)  # B transposed: n x k, K-major
    one = torch.tensor(1.0, device="cuda")
    a, b = dev.allocate(m * k, DType.U8), dev.allocate(n * k, DType.U8)
    dev.copy_from_numpy(a, ta.view(torch.uint8).cpu().numpy().reshape(-1))
    dev.copy_from_numpy(b, tb.view(torch.uint8).cpu().numpy().reshape(-1))
    d = dev.allocate(m * n, DType.BF16)
    cl = dev.cutlass()
    plan = gemm_fp8_plan(DType.BF16, m, n, k)
    kernel = library(plan)
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    td = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def direct(candidate: KernelPlan) -> Callable[[], None]:
        lib = library(candidate).lib
        ws = torch.empty(max(1, lib.atomr_workspace(m, n, k, sm)), dtype=torch.uint8,
                         device="cuda")

        def call() -> None:
            status = lib.atomr_run(m, n, k, ta.data_ptr(), tb.data_ptr(), td.data_ptr(),
                                   td.data_ptr(), None, 1.0, 0.0, 0, ws.data_ptr(), sm,
                                   torch.cuda.current_stream().cuda_stream)
            assert status == 0, (candidate.name, status)
        return call

    def scaled(fast: bool) -> Callable[[], Any]:
        return lambda: torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16, use_fast_accum=fast)

    samples = {
        "torch._scaled_mm (cuBLASLt), events": events(scaled(False), reps, warm),
        "torch._scaled_mm fast accum, events": events(scaled(True), reps, warm),
        "CUTLASS fp8 kernel alone, events": events(direct(plan), reps, warm),
        "ours, blocking (Cutlass.gemm_fp8)": wall_samples(
            lambda: cl.gemm_fp8(a, b, d, m, n, k, timeout_secs=120), reps, warm),
        "ours, async": pipelined(lambda: cl.gemm_fp8_async(a, b, d, m, n, k, timeout_secs=120),
                                 inflight, reps, warm),
    }
    want = scaled(False)().float()
    candidate_errors = {}
    for candidate in candidates:
        samples[f"candidate kernel {_short(candidate)}, events"] = events(
            direct(candidate), reps, warm)
        candidate_errors[candidate.name] = float(
            ((td.float() - want).abs().max() / want.abs().max()).item())
    torch.cuda.synchronize()
    got = torch.tensor(np.asarray(dev.copy_to_numpy(d), np.float32), device="cuda").view(m, n)
    error = float(((got - want).abs().max() / want.abs().max()).item())
    base = statistics.median(samples["torch._scaled_mm (cuBLASLt), events"])
    rows = []
    for name, times in samples.items():
        med = statistics.median(times)
        rows.append([name, med * 1e3, flops / med / 1e12, base / med])
    meta = {"plan": plan.name, "stages": kernel.stages, "smem_bytes": kernel.smem_bytes,
            "max_rel_error_vs_scaled_mm": error, "candidate_errors": candidate_errors,
            "samples_s": samples}
    return rows, meta


_TORCH = {DType.F16: torch.float16, DType.BF16: torch.bfloat16, DType.F32: torch.float32,
          DType.F64: torch.float64}


def family_cases(size: int) -> list[tuple[DType, tuple[int, int, int], KernelPlan]]:
    """The (dtype, shape, plan) triples the families section times."""
    cube = (size, size, size)
    odd = (size - 1, size + 1, size - 3)
    cases = [(dt, cube, gemm_plan(dt, *cube, family=fam))
             for dt in (DType.F16, DType.BF16, DType.F32) for fam in ("sm90", "sm80")]
    cases.append((DType.F64, cube, gemm_plan(DType.F64, *cube)))
    cases += [(dt, odd, gemm_plan(dt, *odd)) for dt in (DType.BF16, DType.F32)]
    return cases


def families_section(size: int, reps: int, warm: int) -> tuple[list[list[Any]], dict[str, Any]]:
    torch.backends.cuda.matmul.allow_tf32 = True
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    rows, errors = [], {}
    for dtype, (m, n, k), plan in family_cases(size):
        ta = torch.randn(m, k, device="cuda", dtype=_TORCH[dtype])
        tb = torch.randn(k, n, device="cuda", dtype=_TORCH[dtype])
        td = torch.empty(m, n, device="cuda", dtype=_TORCH[dtype])
        # the sm90 f32 kernel reads B transposed (TF32 operands are K-major)
        b_in = tb.t().contiguous() if dtype is DType.F32 and plan.family == "sm90" else tb
        lib = library(plan).lib
        ws = torch.empty(max(1, lib.atomr_workspace(m, n, k, sm)), dtype=torch.uint8,
                         device="cuda")

        def direct(lib: Any = lib, ta: Any = ta, b_in: Any = b_in, td: Any = td,
                   ws: Any = ws, m: int = m, n: int = n, k: int = k) -> None:
            status = lib.atomr_run(m, n, k, ta.data_ptr(), b_in.data_ptr(), td.data_ptr(),
                                   td.data_ptr(), None, 1.0, 0.0, 0, ws.data_ptr(), sm,
                                   torch.cuda.current_stream().cuda_stream)
            assert status == 0, status

        theirs = statistics.median(events(lambda ta=ta, tb=tb: torch.matmul(ta, tb), reps, warm))
        ours = statistics.median(events(direct, reps, warm))
        want = torch.matmul(ta.double(), tb.double())
        errors[plan.name] = float(((td.double() - want).abs().max() / want.abs().max()).item())
        flops = 2.0 * m * n * k
        rows.append([dtype.value, f"{m}x{n}x{k}", plan.family, f"a{plan.align} {plan.schedule}",
                     theirs * 1e3, ours * 1e3, flops / ours / 1e12, theirs / ours,
                     f"{errors[plan.name]:.1e}"])
    return rows, {"max_rel_error_vs_float64": errors}


def run_families(dev: Any, args: argparse.Namespace) -> dict[str, Any]:
    rows, meta = families_section(args.family_size, args.reps, args.warm)
    print_table(f"template families on {torch.cuda.get_device_name()}, kernels alone (events)",
                ["dtype", "m x n x k", "family", "loads", "cuBLAS ms", "ours ms", "TFLOP/s",
                 "vs cuBLAS", "max rel err"], rows)
    return {"rows": rows, **meta}


def run_gemm(dev: Any, args: argparse.Namespace) -> dict[str, Any]:
    rows, meta = gemm_section(dev, args.size, args.reps, args.warm, args.inflight, args.rounds)
    print_table(f"bf16 GEMM {args.size}^3 ({meta['plan']})",
                ["path", "ms", "TFLOP/s", "vs cuBLAS"], rows)
    print(f"max |ours - cuBLAS| / max |cuBLAS| = {meta['max_rel_error_vs_cublas']:.2e}")
    return {"rows": rows, **meta}


def run_grouped(dev: Any, args: argparse.Namespace) -> dict[str, Any]:
    rows, meta = grouped_section(dev, args.reps, args.warm)
    print_table("grouped GEMM, 64 mixed bf16 problems",
                ["path", "ms", "TFLOP/s", "time / ours"], rows)
    print(f"max relative error vs torch: {meta['max_rel_error_vs_torch']:.2e}")
    return {"rows": rows, **meta}


def run_fp8(dev: Any, args: argparse.Namespace) -> dict[str, Any]:
    candidates = [p for p in fp8_candidates(args.size) if p != gemm_fp8_plan(
        DType.BF16, args.size, args.size, args.size)] if args.fp8_candidates else []
    rows, meta = fp8_section(dev, args.size, args.reps, args.warm, args.inflight, candidates)
    print_table(f"fp8 GEMM {args.size}^3, e4m3 -> bf16 ({meta['plan']})",
                ["path", "ms", "TFLOP/s", "vs _scaled_mm"], rows)
    print(f"max |ours - _scaled_mm| / max |_scaled_mm| = "
          f"{meta['max_rel_error_vs_scaled_mm']:.2e}; candidates: {meta['candidate_errors']}")
    return {"rows": rows, **meta}


SECTIONS: dict[str, Callable[[Any, argparse.Namespace], dict[str, Any]]] = {
    "gemm": run_gemm, "grouped": run_grouped, "fp8": run_fp8, "families": run_families}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3,
                        help="GEMM section: rounds of every path in turn")
    parser.add_argument("--inflight", type=int, default=4)
    parser.add_argument("--json", default="benchmarks/results/cutlass_bench.json")
    parser.add_argument("--sections", default="gemm,grouped,fp8,families",
                        help="comma-separated: gemm, grouped, fp8, families")
    parser.add_argument("--family-size", type=int, default=4096)
    parser.add_argument("--fp8-candidates", action="store_true",
                        help="also time other fp8 kernels (tile, cluster, schedule) alone")
    add_quick(parser, size=1024, reps=3, warm=1, inflight=2, rounds=1)
    args = parser.parse_args()
    require_cuda()
    sections = set(args.sections.split(","))
    start = time.perf_counter()
    plans = {"gemm": gemm_plan(DType.BF16, args.size, args.size, args.size),
             "grouped": grouped_plan(DType.BF16),
             "fp8": gemm_fp8_plan(DType.BF16, args.size, args.size, args.size)}
    build_kernels([plan for name, plan in plans.items() if name in sections]
                  + (fp8_candidates(args.size) if args.fp8_candidates else [])
                  + ([case[2] for case in family_cases(args.family_size)]
                     if "families" in sections else []))
    print(f"kernels ready in {time.perf_counter() - start:.1f} s; {torch.cuda.get_device_name()}")
    payload: dict[str, Any] = {"benchmark": "cutlass"}
    with System.open("cutlass-bench") as system:
        dev = system.spawn_device(mock=False)
        for name, section in SECTIONS.items():
            if name not in sections:
                continue
            try:  # a failing section is reported, and the others still run
                payload[name] = section(dev, args)
            except Exception:
                traceback.print_exc()
    write_json(args.json, payload)


if __name__ == "__main__":
    main()
