"""Tracing on the CPU: op spans in a Chrome trace, CuptiSession's categories, records and
typed errors (a stand-in cupti module), NvtxKernelTrace and NvmlActor."""

from __future__ import annotations

import enum
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    InvalidArgument,
    LibraryError,
    LibraryUnavailable,
    OutOfMemory,
    System,
    Unrecoverable,
)
from atomr_accel.backends import _optional
from atomr_accel.telemetry import (
    CATEGORIES,
    CuptiSession,
    NvmlActor,
    NvtxKernelTrace,
    OpSpan,
    chrome_trace,
    trace_ops,
    write_chrome_trace,
)

# ------------------------------------------------------------------ op spans -> trace


def check_trace(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert the Chrome trace-event rules Perfetto relies on; return the events."""
    events = document["traceEvents"]
    assert isinstance(events, list) and events
    stamps = [e["ts"] for e in events if e["ph"] != "M"]
    assert stamps == sorted(stamps) and min(stamps) == 0.0
    open_ids: dict[str, float] = {}
    for event in events:
        assert {"ph", "name", "pid", "tid"} <= set(event), event
        assert event["ph"] in {"M", "b", "n", "e", "X"}
        if event["ph"] == "b":
            assert event["id"] not in open_ids
            open_ids[event["id"]] = event["ts"]
        elif event["ph"] in {"n", "e"}:
            assert event["ts"] >= open_ids[event["id"]]
            if event["ph"] == "e":
                del open_ids[event["id"]]
        elif event["ph"] == "X":
            assert event["dur"] >= 0
    assert not open_ids  # every op slice closed
    return list(events)


def test_op_spans_follow_each_op_from_submission_to_answer(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n = 32
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    with System.open("trace") as system:
        dev = system.spawn_device(mock=True, backend_options={"capacity": 1 << 16})
        other = system.spawn_device(mock=True, name="untraced")
        with trace_ops(dev) as tracer:
            a, b, c = (dev.allocate_f32(n * n) for _ in range(3))
            dev.copy_from_numpy(a, x)
            dev.copy_from_numpy(b, y)
            dev.blas().matmul(a, b, c, n, n, n)
            got = dev.copy_to_numpy(c, shape=(n, n))
            with pytest.raises(OutOfMemory):
                dev.allocate_f64(1 << 20)
            other.allocate_f32(4)  # not watched
        dev.allocate_f32(4)  # after the tracer left
        spans = tracer.spans
        with trace_ops(dev) as late:
            system.close()  # leaving the block after the system closed is fine
    assert late.spans == []
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-4, atol=1e-4)
    ops = [s.op for s in spans]
    assert ops == ["Allocate"] * 3 + ["Upload"] * 2 + ["Gemm", "Download", "Allocate"]
    assert len(spans) == 8 and {s.device for s in spans} == {dev.ref.name}
    assert [s.outcome for s in spans].count("OutOfMemory") == 1
    for span in spans:
        assert span.launched_ns is not None and span.generation == 1
        assert span.submitted_ns <= span.launched_ns <= span.completed_ns
    assert [s.completed_ns for s in spans] == sorted(s.completed_ns for s in spans)

    path = write_chrome_trace(tmp_path / "ops.json", spans=spans)
    events = check_trace(json.loads(path.read_text()))
    begins = [e for e in events if e["ph"] == "b"]
    assert [e["name"] for e in begins] == [f"{s.library}.{s.op}" for s in
                                           sorted(spans, key=lambda s: s.submitted_ns)]
    assert sum(e["ph"] == "n" and e["name"] == "launched" for e in events) == 8
    assert {e["args"]["outcome"] for e in events if e["ph"] == "e"} == {"ok", "OutOfMemory"}


def test_trace_carries_cupti_records_beside_the_spans() -> None:
    span = OpSpan("dev", "blas", "Gemm", submitted_ns=1_000, launched_ns=3_000,
                  completed_ns=90_000, generation=1, outcome="ok")
    kernel = {"kind": "kernel", "name": "sgemm_128x64", "start_ns": 10_000, "end_ns": 60_000,
              "stream": 7, "device": 0, "bytes": None, "correlation_id": 42}
    launch = {"kind": "runtime", "name": "cudaLaunchKernel", "start_ns": 4_000,
              "end_ns": 9_000, "stream": None, "device": None, "bytes": None,
              "correlation_id": 42, "thread": 99}
    events = check_trace(chrome_trace([kernel, launch], [span]))
    slices = {e["name"]: e for e in events if e["ph"] == "X"}
    assert slices["sgemm_128x64"]["ts"] == 9.0 and slices["sgemm_128x64"]["dur"] == 50.0
    assert slices["sgemm_128x64"]["args"] == {"stream": 7, "device": 0, "correlation_id": 42}
    assert slices["cudaLaunchKernel"]["tid"] == 99
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"GPU 0", "stream 7", "ops of dev", "atomr-accel host"} <= names
    with pytest.raises(InvalidArgument, match="lacks"):
        chrome_trace([{"kind": "kernel"}])
    with pytest.raises(InvalidArgument, match="OpSpan"):
        chrome_trace(spans=[kernel])  # type: ignore[list-item]


# ----------------------------------------------------------------------- CuptiSession


def test_cupti_without_cupti_python_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)  # as if cupti-python were missing
    _optional._import.cache_clear()
    session = CuptiSession()
    with pytest.raises(LibraryUnavailable, match="cupti-python") as caught:
        session.start(["kernel"])
    assert caught.value.package == "cupti-python" and caught.value.extra == "cupti"
    with pytest.raises(InvalidArgument, match="unknown CUPTI category 'kernels'"):
        session.start(["kernels"])  # checked before CUPTI is looked for
    with pytest.raises(InvalidArgument):
        session.start(["kernel"], timeout_secs=0)
    with pytest.raises(LibraryError, match="range profiler"):
        session.start("range_profiler")
    session.stop()  # not tracing: nothing to do
    assert session.drain() == [] and not session.active
    assert "CuptiSession" in repr(session)
    _optional._import.cache_clear()


def fake_cupti(pending: list[Any]) -> types.ModuleType:
    """A stand-in for ``cupti.cupti``: its clock runs 5 s ahead of perf_counter, and a
    flush hands the ``pending`` activities to the completion callback."""
    cupti = types.ModuleType("cupti.cupti")
    kinds = enum.IntEnum("ActivityKind", "KERNEL CONCURRENT_KERNEL MEMCPY DRIVER RUNTIME MARKER")
    flags = enum.IntFlag("ActivityFlag", {"MARKER_INSTANTANEOUS": 1, "MARKER_START": 2,
                                          "MARKER_END": 4})

    class CuptiError(Exception):
        status = 3

    enabled: set[int] = set()
    state: dict[str, Any] = {"enabled": enabled}

    def register(requested: Any, completed: Any) -> None:
        state["completed"] = completed
        assert requested()[0] > 0

    def flush(flag: int) -> None:
        activities = list(pending)
        pending.clear()
        state["completed"](activities)

    attrs: dict[str, Any] = {
        "ActivityKind": kinds, "ActivityFlag": flags, "cuptiError": CuptiError,
        "ActivityMemcpyKind": enum.IntEnum("ActivityMemcpyKind", "HTOD DTOH"),
        "CallbackDomain": enum.IntEnum("CallbackDomain", "DRIVER_API RUNTIME_API"),
        "Result": enum.IntEnum("Result", "SUCCESS ERROR_UNKNOWN ERROR_NOT_READY"),
        "activity_register_callbacks": register,
        "activity_enable": enabled.add,
        "activity_disable": enabled.discard,
        "activity_flush_all": flush,
        "get_timestamp": lambda: time.perf_counter_ns() + 5_000_000_000,
        "get_callback_name": lambda domain, cbid: {1: "cuLaunchKernel", 2: "cuMemAlloc_v2",
                                                   3: "cudaLaunchKernel"}[cbid],
        "state": state,
    }
    for key, value in attrs.items():
        setattr(cupti, key, value)
    return cupti


def activity(kind: str, **fields: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(kind=kind, **fields)


def test_cupti_session_turns_activities_into_records(monkeypatch: pytest.MonkeyPatch) -> None:
    pending: list[Any] = []
    cupti = fake_cupti(pending)
    kinds = cupti.ActivityKind
    package = types.ModuleType("cupti")
    package.cupti = cupti  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", package)
    monkeypatch.setitem(sys.modules, "cupti.cupti", cupti)
    _optional._import.cache_clear()
    ahead = 5_000_000_000
    session = CuptiSession()
    session.start(["kernel", "memcpy", "kernel_launch", "range"])
    assert session.active and session.categories == ("kernel", "memcpy", "kernel_launch", "range")
    assert cupti.state["enabled"] == {kinds.CONCURRENT_KERNEL, kinds.MEMCPY, kinds.DRIVER,
                                      kinds.RUNTIME, kinds.MARKER}
    with pytest.raises(InvalidArgument, match="already"):
        CuptiSession().start()
    pending += [
        activity(kinds.CONCURRENT_KERNEL, name="sgemm", start=ahead + 500, end=ahead + 900,
                 stream_id=13, device_id=0, correlation_id=8, grid_x=4, grid_y=2, grid_z=1,
                 block_x=128, block_y=1, block_z=1),
        activity(kinds.MEMCPY, copy_kind=cupti.ActivityMemcpyKind.HTOD, start=ahead + 100,
                 end=ahead + 300, stream_id=13, device_id=0, bytes=4096, correlation_id=5),
        activity(kinds.DRIVER, cbid=1, start=ahead + 400, end=ahead + 450, thread_id=77,
                 correlation_id=8),
        activity(kinds.DRIVER, cbid=2, start=ahead + 350, end=ahead + 360, thread_id=77,
                 correlation_id=6),  # not a launch: left out
        activity(kinds.MARKER, flags_=2, id=3, name="atomr-accel: step", timestamp=ahead + 50,
                 domain=""),
        activity(kinds.MARKER, flags_=4, id=3, name="", timestamp=ahead + 950, domain=""),
    ]
    records = session.drain()
    assert [r["kind"] for r in records] == ["range", "memcpy", "driver", "kernel"]
    by_kind = {r["kind"]: r for r in records}
    kernel = by_kind["kernel"]
    # the stand-in's clock is 5 s ahead: records come back on perf_counter's clock
    assert abs(kernel["start_ns"] - 500) < 1_000_000
    assert kernel["end_ns"] - kernel["start_ns"] == 400
    assert (kernel["name"], kernel["stream"], kernel["device"], kernel["correlation_id"]) == \
        ("sgemm", 13, 0, 8)
    assert kernel["grid"] == [4, 2, 1] and kernel["bytes"] is None
    assert by_kind["memcpy"]["bytes"] == 4096 and by_kind["memcpy"]["name"] == "memcpy HTOD"
    assert by_kind["driver"]["name"] == "cuLaunchKernel" and by_kind["driver"]["thread"] == 77
    assert by_kind["range"]["name"] == "atomr-accel: step"
    assert by_kind["range"]["end_ns"] - by_kind["range"]["start_ns"] == 900
    assert session.drain() == []
    session.stop()
    assert not session.active and cupti.state["enabled"] == set()
    check_trace(chrome_trace(records))
    _optional._import.cache_clear()


def test_every_original_category_is_known() -> None:
    assert list(CATEGORIES) == ["kernel", "kernel_launch", "memcpy", "driver", "driver_api",
                                "runtime", "runtime_api", "range", "range_profiler"]


# --------------------------------------------------------------------- NVTX and NVML


def test_nvtx_kernel_trace_pushes_a_named_range_or_raises_without_nvtx(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from atomr_accel.telemetry import _nvtx

    monkeypatch.setattr(_nvtx, "_unusable", _nvtx._unusable)  # restored afterwards
    trace = NvtxKernelTrace()
    assert "NvtxKernelTrace" in repr(trace) and trace.message == "atomr-accel: span"
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvtx", None)  # no NVTX
    with pytest.raises(Unrecoverable, match="NVTX"), trace:
        pass
    calls: list[tuple[str, ...]] = []
    nvtx = types.ModuleType("cupy.cuda.nvtx")
    nvtx.RangePush = lambda name: calls.append(("push", name))  # type: ignore[attr-defined]
    nvtx.RangePop = lambda: calls.append(("pop",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvtx", nvtx)
    step = NvtxKernelTrace("step", "my-app")
    with pytest.raises(KeyError), step, step:
        raise KeyError("the ranges still close")
    assert calls == [("push", "my-app: step"), ("push", "my-app: step"), ("pop",), ("pop",)]


def fake_nvml(gpus: int) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def power(handle: tuple[str, int]) -> int:
        if handle[1] == 1:
            raise NVMLError("Not Supported")
        return 187_250

    attrs: dict[str, Any] = {
        "NVMLError": NVMLError, "NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1,
        "NVML_CLOCK_MEM": 2, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0,
        "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: gpus,
        "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
        "nvmlDeviceGetName": lambda h: f"Fake GPU {h[1]}",
        "nvmlDeviceGetUUID": lambda h: f"GPU-0000-{h[1]}",
        "nvmlDeviceGetPowerUsage": power,
        "nvmlDeviceGetTemperature": lambda h, sensor: 40 + h[1],
        "nvmlDeviceGetClockInfo": lambda h, clock: {1: 1755, 2: 2619}[clock],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=80 << 30, used=(3 + h[1]) << 30, free=0),
    }
    for key, value in attrs.items():
        setattr(nvml, key, value)
    return nvml


def test_nvml_actor_reads_every_gpu_under_the_original_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(Unrecoverable, match="pynvml is not installed"):
        NvmlActor()
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(2))
    with pytest.raises(InvalidArgument):
        NvmlActor(interval_secs=0)
    with NvmlActor(interval_secs=0.01) as nvml:
        reading = nvml.read(timeout_secs=5.0)
        assert set(reading) == {"devices", "generated_at_unix_nanos"}
        assert reading["devices"] == [
            {"device_index": i, "uuid": f"GPU-0000-{i}", "name": f"Fake GPU {i}",
             "power_milliwatts": 187_250 if i == 0 else None, "temperature_gpu_c": 40 + i,
             "clock_sm_mhz": 1755, "clock_mem_mhz": 2619, "mem_total_bytes": 80 << 30,
             "mem_used_bytes": (3 + i) << 30} for i in range(2)]
        assert nvml.power_w() == pytest.approx(187.25)
        deadline = time.monotonic() + 10
        while nvml.latest is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the probes' own timer samples every 10 ms
        latest = nvml.latest
        assert latest is not None and latest["devices"] == reading["devices"]
        with pytest.raises(InvalidArgument):
            nvml.read(timeout_secs=-1)
        assert "NvmlActor" in repr(nvml)
    nvml.close()  # twice is fine
