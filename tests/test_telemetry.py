"""Telemetry: Prometheus metrics per system, served over HTTP; op observers; NVML; NVTX; logs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import types
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, OutOfMemory, System, Unrecoverable
from atomr_accel.actor import ActorSystem, Props
from atomr_accel.core import DType
from atomr_accel.core._op import Op
from atomr_accel.core.ops._memory import Allocate
from atomr_accel.device import DeviceActor, DeviceConfig, DeviceState
from atomr_accel.telemetry import (
    GetSample,
    NvmlProbe,
    NvmlSample,
    configure_logging,
    nvtx_range,
)

prometheus_parser = pytest.importorskip("prometheus_client.parser")

pytestmark = pytest.mark.anyio


def metric(text: str, sample_name: str, /, **labels: str) -> float:
    """Sum of the samples called ``sample_name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for family in prometheus_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == sample_name and labels.items() <= sample.labels.items():
                total += sample.value
                found = True
    assert found, f"no sample {sample_name}{labels} in:\n{text}"
    return total


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


# ------------------------------------------------------------------------ Prometheus


async def test_metrics_count_ops_latency_allocations_oom_and_device_gauges() -> None:
    async with await System.open_async("t") as system:
        telemetry = await system.enable_telemetry_async(interval=None)
        dev = await system.spawn_device_async(mock=True, backend_options={"capacity": 1 << 16})
        name = dev.ref.name
        n = 16
        x = np.arange(n * n, dtype=np.float32)
        bufs = [await dev.allocate_f32_async(n * n) for _ in range(3)]
        await dev.copy_from_numpy_async(bufs[0], x)
        await dev.copy_from_numpy_async(bufs[1], x)
        for _ in range(5):
            await dev.blas().gemm_f32_async(*bufs, m=n, n=n, k=n)
        with pytest.raises(OutOfMemory):
            await dev.allocate_f64_async(1 << 16)
        await dev.free_async(bufs[2])
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        await dev.allocate_f32_async(100)  # on generation 2
        await telemetry.refresh_async()
        text = telemetry.render()

    assert metric(text, "atomr_ops_total", device=name, library="blas", outcome="ok") == 5
    assert metric(text, "atomr_op_latency_seconds_count", device=name, library="blas") == 5
    assert metric(text, "atomr_op_latency_seconds_sum", device=name, library="blas") > 0
    assert metric(text, "atomr_ops_in_flight", device=name) == 0
    assert metric(text, "atomr_ops_total", device=name, outcome="OutOfMemory") == 1
    assert metric(text, "atomr_ops_total", device=name, outcome="ContextPoisoned") == 1
    assert metric(text, "atomr_allocations_total", device=name) == 4
    assert metric(text, "atomr_allocated_bytes_total", device=name) == 3 * n * n * 4 + 400
    assert metric(text, "atomr_frees_total", device=name) == 1
    assert metric(text, "atomr_out_of_memory_total", device=name) == 1
    assert metric(text, "atomr_device_generation", device=name) == 2
    assert metric(text, "atomr_device_restarts_total", device=name) == 1
    assert metric(text, "atomr_device_ready", device=name) == 1
    assert metric(text, "atomr_device_queue_depth", device=name) == 0
    assert metric(text, "atomr_device_bytes_allocated", device=name) == 400
    assert metric(text, "atomr_device_memory_total_bytes", device=name) == 1 << 16
    assert metric(text, "atomr_device_memory_free_bytes", device=name) == (1 << 16) - 400


async def test_each_system_has_its_own_registry_served_over_http() -> None:
    async with await System.open_async("one") as one, await System.open_async("two") as two:
        first = await one.enable_telemetry_async(port=0)
        second = await two.enable_telemetry_async(port=0)
        assert first.port and second.port and first.port != second.port
        assert await one.enable_telemetry_async(port=0) is first  # enabled once
        dev = await one.spawn_device_async(mock=True)
        await two.spawn_device_async(mock=True)
        kept = [await dev.allocate_u8_async(8) for _ in range(3)]  # a collected one is freed
        await first.refresh_async()
        served = await asyncio.to_thread(fetch, f"http://127.0.0.1:{first.port}/metrics")
        other = await asyncio.to_thread(fetch, f"http://127.0.0.1:{second.port}/metrics")
        assert metric(served, "atomr_allocations_total", device=dev.ref.name) == 3
        assert metric(served, "atomr_device_bytes_allocated", device=dev.ref.name) == 24
        assert dev.ref.name not in other  # another system's registry
        assert len(kept) == 3
        port = first.port
    with pytest.raises(urllib.error.URLError):  # closing the system stopped the server
        await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/metrics")


async def test_sampling_timer_keeps_device_gauges_current() -> None:
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True)
        telemetry = await system.enable_telemetry_async(interval=0.01)
        kept = await dev.allocate_u8_async(4096)  # held: a collected buffer is freed
        # Nothing but the sampler's timer updates the gauge, so poll what it serves.
        while "atomr_device_bytes_allocated{" not in (text := telemetry.render()) or \
                metric(text, "atomr_device_bytes_allocated") != 4096:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert len(kept) == 4096


class Recorder:
    """An ``OpObserver`` that keeps what it is told."""

    def __init__(self) -> None:
        self.started: list[tuple[str, str]] = []
        self.finished: list[tuple[str, str, float, BaseException | None]] = []

    def op_started(self, device: str, op: Op) -> None:
        self.started.append((device, type(op).__name__))

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        self.finished.append((device, type(op).__name__, seconds, error))


class Broken:
    """An observer that raises: the device must not care."""

    def op_started(self, device: str, op: Op) -> None:
        raise RuntimeError("observer bug")

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        raise RuntimeError("observer bug")


async def test_op_observers_see_every_request_start_and_end(
        caplog: pytest.LogCaptureFixture) -> None:
    state = DeviceState(0, "dev-a")
    recorder = Recorder()
    state.add_observer(recorder)
    state.add_observer(recorder)  # once only
    state.add_observer(Broken())
    config = DeviceConfig(backend_options={"capacity": 64})
    async with ActorSystem("t") as system:
        dev = system.spawn(DeviceActor.props(config, state), "dev")
        ref = await dev.ask(Allocate(DType.F32, 4))
        with pytest.raises(OutOfMemory):
            await dev.ask(Allocate(DType.F64, 64))
        state.remove_observer(recorder)
        await dev.ask(Allocate(DType.F32, 1))
    assert recorder.started == [("dev-a", "Allocate")] * 2
    assert recorder.finished[0][:2] == ("dev-a", "Allocate") and recorder.finished[0][3] is None
    assert isinstance(recorder.finished[1][3], OutOfMemory)
    assert all(seconds >= 0 for _, _, seconds, _ in recorder.finished)
    assert ref.generation == 1 and state.bytes_allocated == 20
    complaints = [r for r in caplog.records if r.getMessage().startswith("op observer")]
    assert len(complaints) == 6 and all(r.exc_info for r in complaints)  # 3 starts, 3 ends


async def test_in_flight_gauge_counts_requests_held_in_a_stopped_worker() -> None:
    import os
    import signal

    async with await System.open_async("t") as system:
        telemetry = await system.enable_telemetry_async(interval=None)
        dev = await system.spawn_device_async(mock=True, isolation="process")
        pid = (await dev.stats_async()).host_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            held = [asyncio.ensure_future(dev.allocate_u8_async(1)) for _ in range(4)]
            await asyncio.sleep(0)  # each task runs up to its ask, which queues the request
            assert (await dev.stats_async()).in_flight == 4
            text = telemetry.render()
            assert metric(text, "atomr_ops_in_flight", library="memory") == 4
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.gather(*held)
        assert metric(telemetry.render(), "atomr_ops_in_flight", library="memory") == 0


# ------------------------------------------------------------------------------ NVML


def fake_pynvml(ecc_supported: bool = False, init_error: bool = False) -> types.ModuleType:
    """A stand-in for ``pynvml`` reporting one GPU."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        if init_error:
            raise NVMLError("Driver Not Loaded")

    def ecc(handle: Any, kind: int, counter: int) -> int:
        if not ecc_supported:
            raise NVMLError("Not Supported")
        return 3

    attrs: dict[str, Any] = {
        "NVMLError": NVMLError, "NVML_TEMPERATURE_GPU": 0, "NVML_CLOCK_SM": 1,
        "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0,
        "nvmlInit": init, "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda i: ("gpu", i),
        "nvmlDeviceGetName": lambda h: b"Fake GPU",
        "nvmlDeviceGetPowerUsage": lambda h: 251_500,  # milliwatts
        "nvmlDeviceGetTemperature": lambda h, sensor: 61,
        "nvmlDeviceGetClockInfo": lambda h, clock: 1980,
        "nvmlDeviceGetTotalEccErrors": ecc,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=80 << 30, used=5 << 30, free=75 << 30),
    }
    for key, value in attrs.items():
        setattr(nvml, key, value)
    return nvml


async def test_nvml_probe_without_nvml_answers_device_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from atomr_accel import DeviceUnavailable

    monkeypatch.setitem(sys.modules, "pynvml", None)  # as if nvidia-ml-py were missing
    async with ActorSystem("t") as system:
        probe = system.spawn(Props(NvmlProbe, 0, 0.01), "nvml")
        with pytest.raises(DeviceUnavailable, match="pynvml is not installed"):
            await probe.ask(GetSample())
        with pytest.raises(DeviceUnavailable):  # it stays up and keeps answering
            await probe.ask(GetSample())
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=True))
    async with ActorSystem("t") as system:
        probe = system.spawn(Props(NvmlProbe, 0), "nvml")
        with pytest.raises(DeviceUnavailable, match="Driver Not Loaded"):
            await probe.ask(GetSample())


async def test_nvml_probe_samples_on_its_timer_and_feeds_the_gpu_gauges(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    async with ActorSystem("t") as system:
        samples: list[NvmlSample] = []
        two = asyncio.Event()

        def on_sample(sample: NvmlSample) -> None:
            samples.append(sample)
            if len(samples) == 2:
                two.set()

        probe = system.spawn(Props(NvmlProbe, 0, 0.01, on_sample), "nvml")
        await two.wait()  # the timer sampled twice without being asked
        sample = await probe.ask(GetSample())
    assert sample == NvmlSample(index=0, name="Fake GPU", power_watts=251.5, temperature_c=61,
                                sm_clock_mhz=1980, ecc_errors=None, memory_used=5 << 30,
                                memory_total=80 << 30)

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(ecc_supported=True))
    async with await System.open_async("t") as system:
        telemetry = await system.enable_telemetry_async(interval=None)
        probe = await telemetry.start_nvml_async(0, interval=None)
        assert (await probe.ask(GetSample())).ecc_errors == 3
        text = telemetry.render()
    labels = {"gpu": "0", "name": "Fake GPU"}
    assert metric(text, "atomr_gpu_power_watts", **labels) == 251.5
    assert metric(text, "atomr_gpu_temperature_celsius", **labels) == 61
    assert metric(text, "atomr_gpu_sm_clock_mhz", **labels) == 1980
    assert metric(text, "atomr_gpu_ecc_uncorrected_errors", **labels) == 3
    assert metric(text, "atomr_gpu_memory_used_bytes", **labels) == 5 << 30


# ------------------------------------------------------------------------------ NVTX


def test_nvtx_ranges_push_and_pop_through_cupy_when_it_is_loaded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    nvtx = types.ModuleType("cupy.cuda.nvtx")
    nvtx.RangePush = lambda name: calls.append(("push", name))  # type: ignore[attr-defined]
    nvtx.RangePop = lambda: calls.append(("pop",))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupy.cuda.nvtx", nvtx)
    with nvtx_range("gemm"), nvtx_range("inner"):
        calls.append(("work",))
    with pytest.raises(ValueError), nvtx_range("failing"):
        raise ValueError("the range still closes")
    assert calls == [("push", "gemm"), ("push", "inner"), ("work",), ("pop",), ("pop",),
                     ("push", "failing"), ("pop",)]
    nvtx.available = False  # type: ignore[attr-defined]  # CuPy without libnvToolsExt
    with nvtx_range("ignored"):
        pass
    assert len(calls) == 7


def test_nvtx_range_without_cupy_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "cupy.cuda.nvtx", raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    ran = []
    with nvtx_range("anything"):
        ran.append(True)
    assert ran == [True] and "cupy" not in sys.modules


# --------------------------------------------------------------------------- logging


async def test_device_lifecycle_is_logged_with_structured_fields(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="atomr_accel.device")
    async with await System.open_async("t") as system:
        dev = await system.spawn_device_async(mock=True, backend_options={"capacity": 64})
        name = dev.ref.name
        with pytest.raises(OutOfMemory):
            await dev.allocate_f64_async(100)
        with pytest.raises(ContextPoisoned):
            await dev.inject_fault_async(FaultKind.POISON)
        await dev.allocate_u8_async(1)
        with pytest.raises(Unrecoverable):
            await dev.inject_fault_async(FaultKind.UNRECOVERABLE)
        with pytest.raises(Unrecoverable):  # refused once the device has stopped
            await dev.allocate_u8_async(1)
    events = [(r.event, r.levelname, getattr(r, "generation", None))  # type: ignore[attr-defined]
              for r in caplog.records if r.name == "atomr_accel.device"]
    assert events == [
        ("context_ready", "INFO", 1), ("out_of_memory", "WARNING", None),
        ("context_down", "WARNING", 1), ("context_ready", "INFO", 2),
        ("context_down", "WARNING", 2), ("device_stopped", "ERROR", 2),
    ]
    device_records = [r for r in caplog.records if r.name == "atomr_accel.device"]
    assert all(r.device == name for r in device_records)  # type: ignore[attr-defined]
    oom = device_records[1]
    assert (oom.requested, oom.available) == (800, 64)  # type: ignore[attr-defined]
    assert device_records[3].restarts == 1  # type: ignore[attr-defined]


def test_configure_logging_prints_the_fields_as_text_or_json() -> None:
    logger = logging.getLogger("atomr_accel")
    level = logger.level
    text, lines = io.StringIO(), io.StringIO()
    try:
        configure_logging(logging.INFO, stream=text)
        handler = configure_logging("INFO", stream=lines, json=True)  # replaces the first
        printing = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
        assert printing == [handler]  # beside the package's own NullHandler
        logging.getLogger("atomr_accel.device").warning(
            "device %s went down", "d-1", extra={"event": "context_down", "generation": 3})
        logging.getLogger("atomr_accel.device").debug("below the level")
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.setLevel(level)
    assert text.getvalue() == ""
    record = json.loads(lines.getvalue())
    assert record["message"] == "device d-1 went down"
    assert (record["event"], record["generation"], record["level"]) == \
        ("context_down", 3, "WARNING")
    plain = io.StringIO()
    factory = logging.getLogRecordFactory()

    def foreign(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        record._foreign_stamp = 1  # type: ignore[attr-defined]  # as Ray's factory adds
        return record

    try:
        logging.setLogRecordFactory(foreign)
        configure_logging(stream=plain)
        logging.getLogger("atomr_accel.device").info("up", extra={"event": "context_ready"})
    finally:
        logging.setLogRecordFactory(factory)
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.setLevel(level)
    assert plain.getvalue().rstrip().endswith("INFO atomr_accel.device up event=context_ready")
