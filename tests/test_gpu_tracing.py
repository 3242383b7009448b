"""Tracing on a GPU: CUPTI records of a gemm run through our device, a CuPy gemm's kernel
durations against CUDA events, the Chrome trace of both, NvmlActor and NvtxKernelTrace.

With ``ATOMR_TRACE_OUT`` set, the records, the trace and a summary are written there.
Run on a GPU machine: ``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_tracing.py``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import System
from atomr_accel.telemetry import (
    CuptiSession,
    NvmlActor,
    NvtxKernelTrace,
    chrome_trace,
    trace_ops,
    write_chrome_trace,
)

pytestmark = pytest.mark.gpu

N = 4096


def out_dir() -> Path | None:
    where = os.environ.get("ATOMR_TRACE_OUT")
    if not where:
        return None
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def note(line: str) -> None:
    """Print ``line`` and append it to the summary in ``ATOMR_TRACE_OUT``."""
    print(line)
    folder = out_dir()
    if folder is not None:
        with (folder / "summary.txt").open("a") as summary:
            summary.write(line + "\n")


@pytest.fixture(scope="module")
def cupti_session() -> Iterator[CuptiSession]:
    try:
        import cupti.cupti  # noqa: F401  # a libcupti that does not load is a failure
    except ModuleNotFoundError:
        pytest.skip("needs cupti-python")
    yield CuptiSession()


def test_cupti_records_a_gemm_through_our_device(cupti_session: CuptiSession) -> None:
    import cupy as cp

    rng = np.random.default_rng(3)
    x = rng.standard_normal((N, N)).astype(np.float32)
    y = rng.standard_normal((N, N)).astype(np.float32)
    with System.open("gpu-trace") as system:
        dev = system.spawn_device(mock=False)
        a, b, c = (dev.allocate_f32(N * N) for _ in range(3))
        dev.copy_from_numpy(a, x)
        dev.copy_from_numpy(b, y)
        dev.blas().matmul(a, b, c, N, N, N)  # warm-up: cuBLAS handle and kernel loads
        dev.copy_to_numpy(c, shape=(N, N))
        cupti_session.start(["kernel", "memcpy", "kernel_launch", "range"], timeout_secs=10)
        try:
            with trace_ops(dev) as tracer, NvtxKernelTrace("gemm x3", "atomr-accel-test"):
                for _ in range(3):
                    dev.blas().matmul(a, b, c, N, N, N)
                got = dev.copy_to_numpy(c, shape=(N, N))
            cp.cuda.Device(0).synchronize()
        finally:
            cupti_session.stop(timeout_secs=10)
        records = cupti_session.drain(timeout_secs=10)
        spans = tracer.spans
    want = x.astype(np.float64) @ y.astype(np.float64)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4

    kernels = [r for r in records if r["kind"] == "kernel"]
    gemms = [s for s in spans if s.op == "Gemm"]
    assert len(gemms) == 3
    note(f"{len(records)} CUPTI records: "
         f"{sorted({(r['kind']) for r in records})}; op spans: {[s.op for s in spans]}")
    for record in kernels:
        note(f"kernel {record['name'][:70]!r} {(record['end_ns'] - record['start_ns']) / 1e3:.1f}"
             f" us stream {record['stream']} device {record['device']} "
             f"corr {record['correlation_id']}")
    gemm_kernels = [k for k in kernels if "gemm" in k["name"].lower()]
    assert len(gemm_kernels) >= 3, kernels
    for span in gemms:  # each op's kernel ran inside its span, on one clock
        inside = [k for k in gemm_kernels
                  if span.submitted_ns - 50_000 <= k["start_ns"] <= span.completed_ns + 50_000_000]
        assert inside, (span, gemm_kernels)
    launches = [r for r in records if r["kind"] in ("driver", "runtime")]
    assert launches and all("Launch" in r["name"] for r in launches)
    assert {r["correlation_id"] for r in gemm_kernels} <= {r["correlation_id"] for r in launches}
    copies = [r for r in records if r["kind"] == "memcpy" and "DTOH" in r["name"]]
    assert sum(r["bytes"] for r in copies) >= N * N * 4, copies  # the result came back
    ranges = [r for r in records if r["kind"] == "range"]
    note(f"NVTX ranges seen by CUPTI: {[r['name'] for r in ranges]}")

    document = chrome_trace(records, spans)
    json.dumps(document)
    folder = out_dir()
    if folder is not None:
        write_chrome_trace(folder / "gemm_trace.json", records, spans)
        (folder / "cupti_records.json").write_text(json.dumps(records, indent=1))


def test_cupti_kernel_durations_match_cuda_events(cupti_session: CuptiSession) -> None:
    import cupy as cp

    rng = np.random.default_rng(4)
    a = cp.asarray(rng.standard_normal((N, N)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((N, N)).astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        cp.matmul(a, b)  # warm-up
    stream.synchronize()
    windows: list[tuple[int, int, float]] = []
    cupti_session.start(["kernel"], timeout_secs=10)
    try:
        with stream:
            cp.matmul(a, b)  # the first launch after CUPTI starts pays for its set-up
        stream.synchronize()
        for _ in range(5):
            begin, end = cp.cuda.Event(), cp.cuda.Event()
            before = time.perf_counter_ns()
            with stream:
                begin.record(stream)
                cp.matmul(a, b)
                end.record(stream)
            end.synchronize()
            after = time.perf_counter_ns()
            windows.append((before, after, cp.cuda.get_elapsed_time(begin, end) * 1e3))
    finally:
        cupti_session.stop(timeout_secs=10)
    kernels = [r for r in cupti_session.drain(timeout_secs=10) if r["kind"] == "kernel"]
    ratios = []
    for before, after, event_us in windows:
        mine = [k for k in kernels if before <= k["start_ns"] <= after]
        assert mine, (before, after, kernels)
        cupti_us = (max(k["end_ns"] for k in mine) - min(k["start_ns"] for k in mine)) / 1e3
        note(f"cupy gemm {N}^3 f32: CUPTI {cupti_us:.1f} us ({len(mine)} kernel(s): "
             f"{mine[0]['name'][:50]}), CUDA events {event_us:.1f} us, "
             f"ratio {cupti_us / event_us:.3f}")
        ratios.append(cupti_us / event_us)
    assert all(abs(ratio - 1) < 0.10 for ratio in ratios), ratios


def test_nvml_actor_reads_the_real_gpu() -> None:
    pytest.importorskip("pynvml", reason="needs nvidia-ml-py")
    import cupy as cp

    with NvmlActor(interval_secs=0.5) as nvml:
        reading = nvml.read(timeout_secs=5)
        power = nvml.power_w(timeout_secs=5)
    devices: list[dict[str, Any]] = reading["devices"]
    note(f"NvmlActor.read(): {json.dumps(reading)}; power_w() = {power}")
    assert len(devices) == cp.cuda.runtime.getDeviceCount()
    first = devices[0]
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    _, total = cp.cuda.runtime.memGetInfo()
    assert first["name"] == name and first["uuid"].startswith("GPU-")
    assert abs(first["mem_total_bytes"] - total) <= 1 << 30  # NVML may count reserved memory
    assert 0 < first["mem_used_bytes"] <= first["mem_total_bytes"]
    assert 0 < first["temperature_gpu_c"] < 100 and first["clock_sm_mhz"] > 0
    assert first["clock_mem_mhz"] > 0 and power is not None and 20 < power < 1000
    assert abs(reading["generated_at_unix_nanos"] - time.time_ns()) < 60e9


def test_nvtx_kernel_trace_on_the_gpu() -> None:
    import cupy as cp

    trace = NvtxKernelTrace("step", "atomr-accel-test")
    with trace:
        total = float(cp.arange(1000, dtype=cp.float64).sum())
    assert total == 999 * 1000 / 2 and "NvtxKernelTrace" in repr(trace)
