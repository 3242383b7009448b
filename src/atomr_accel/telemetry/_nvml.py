"""NvmlProbe: an actor that samples a GPU's power, temperature, clocks, ECC and memory (NVML)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atomr_accel.actor import Actor
from atomr_accel.core._errors import DeviceUnavailable

__all__ = ["GetSample", "NvmlProbe", "NvmlSample"]

_log = logging.getLogger("atomr_accel.telemetry")


@dataclass(frozen=True, slots=True)
class NvmlSample:
    """One reading of one GPU; a figure the GPU does not report is None."""

    index: int
    name: str
    power_watts: float | None
    temperature_c: float | None
    sm_clock_mhz: float | None
    ecc_errors: int | None
    """Uncorrected ECC errors since the driver loaded (volatile count)."""
    memory_used: int | None
    memory_total: int | None
    uuid: str | None = None
    """The GPU's UUID (``GPU-...``), stable across reboots and device orderings."""
    memory_clock_mhz: float | None = None


@dataclass(frozen=True, slots=True)
class GetSample:
    """Ask an ``NvmlProbe`` for a fresh ``NvmlSample`` (``DeviceUnavailable`` without NVML)."""


@dataclass(frozen=True, slots=True)
class _Tick:
    pass


def _figure(read: Callable[[], Any], nvml: Any) -> Any:
    """``read()``, or None when NVML says the GPU does not support it (or the installed
    ``pynvml`` is too old to have the call)."""
    try:
        return read()
    except (nvml.NVMLError, AttributeError):
        return None


def _text(value: Any) -> str | None:
    """An NVML string (bytes in older ``pynvml``) as ``str``; None stays None."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe(Actor):
    """Samples GPU ``index`` through NVML (``pynvml``, from ``nvidia-ml-py``).

    Every ``interval`` seconds (a timer; None for none) it takes a sample and
    hands it to ``on_sample`` (e.g. ``Telemetry``'s gauges); ``GetSample``
    answers a fresh one. NVML calls run on a worker thread, not the loop.
    Without NVML or that GPU the probe stays up, samples nothing and answers
    ``GetSample`` with ``DeviceUnavailable`` saying why.
    """

    def __init__(self, index: int = 0, interval: float | None = 5.0,
                 on_sample: Callable[[NvmlSample], None] | None = None) -> None:
        self.index = index
        self.interval = interval
        self.on_sample = on_sample
        self.nvml: Any = None
        self.handle: Any = None
        self.unavailable: DeviceUnavailable | None = None

    async def pre_start(self) -> None:
        """Open NVML and the GPU; remember why not if that fails, then start the timer."""
        try:
            import pynvml
        except ImportError as exc:
            self.unavailable = DeviceUnavailable(
                "NVML is not available: pynvml is not installed "
                "(pip install 'atomr-accel-py[telemetry]')")
            self.unavailable.__cause__ = exc
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except pynvml.NVMLError as exc:
            self.unavailable = DeviceUnavailable(f"NVML cannot open GPU {self.index}: {exc}")
            self.unavailable.__cause__ = exc
            return
        self.nvml = pynvml
        if self.interval is not None:
            self.context.schedule_repeatedly(self.interval, _Tick(), key="sample")

    async def receive(self, message: Any) -> Any:
        """Answer ``GetSample``; sample on each timer tick."""
        if isinstance(message, GetSample):
            if self.unavailable is not None:
                self.context.defer_reply().set_exception(self.unavailable)
                return None
            return await self._sample()
        if isinstance(message, _Tick):
            await self._sample()
            return None
        raise TypeError(f"an NVML probe does not handle {message!r}")

    async def _sample(self) -> NvmlSample:
        sample = await asyncio.to_thread(self._read)
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    def _read(self) -> NvmlSample:
        nvml, handle = self.nvml, self.handle
        memory = _figure(lambda: nvml.nvmlDeviceGetMemoryInfo(handle), nvml)
        power = _figure(lambda: nvml.nvmlDeviceGetPowerUsage(handle), nvml)
        name = _figure(lambda: nvml.nvmlDeviceGetName(handle), nvml)
        return NvmlSample(
            index=self.index,
            name=_text(name) or "",
            power_watts=None if power is None else power / 1000.0,
            temperature_c=_figure(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU), nvml),
            sm_clock_mhz=_figure(
                lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), nvml),
            ecc_errors=_figure(lambda: nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC), nvml),
            memory_used=None if memory is None else int(memory.used),
            memory_total=None if memory is None else int(memory.total),
            uuid=_text(_figure(lambda: nvml.nvmlDeviceGetUUID(handle), nvml)),
            memory_clock_mhz=_figure(
                lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM), nvml),
        )

    async def post_stop(self) -> None:
        """Close NVML if this probe opened it."""
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                _log.debug("nvmlShutdown failed", exc_info=True)
