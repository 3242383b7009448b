"""NvmlActor: the original's NVML reader (``read()``, ``power_w()``), on ``NvmlProbe`` actors."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from atomr_accel import actor
from atomr_accel.actor import ActorRef, ActorSystem, Props
from atomr_accel.core._errors import AskTimeout, InvalidArgument, Unrecoverable
from atomr_accel.facade._portal import ClosesOnExit, LoopThread, Portal
from atomr_accel.telemetry._nvml import GetSample, NvmlProbe, NvmlSample

__all__ = ["NvmlActor", "device_reading"]


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise InvalidArgument(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _gpu_count() -> int:
    """Open NVML and count the GPUs; ``Unrecoverable`` (saying why) where it cannot."""
    try:
        import pynvml
    except ImportError as exc:
        raise Unrecoverable("NVML is not available: pynvml is not installed "
                            "(pip install 'atomr-accel-py[telemetry]')") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise Unrecoverable(f"NVML is not available: {exc}") from exc
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        raise Unrecoverable(f"NVML cannot count the GPUs: {exc}") from exc
    finally:
        pynvml.nvmlShutdown()  # each probe opens NVML for itself


def device_reading(sample: NvmlSample) -> dict[str, Any]:
    """One GPU's entry of ``NvmlActor.read()``, under the original's field names."""
    power = sample.power_watts
    return {
        "device_index": sample.index,
        "uuid": sample.uuid,
        "name": sample.name,
        "power_milliwatts": None if power is None else round(power * 1000),
        "temperature_gpu_c": sample.temperature_c,
        "clock_sm_mhz": sample.sm_clock_mhz,
        "clock_mem_mhz": sample.memory_clock_mhz,
        "mem_total_bytes": sample.memory_total,
        "mem_used_bytes": sample.memory_used,
    }


class NvmlActor(ClosesOnExit):
    """Reads every GPU through NVML: ``NvmlActor(interval_secs=1.0).read()``.

    Construction raises ``Unrecoverable`` without NVML (``pynvml`` from
    ``nvidia-ml-py``, the ``telemetry`` extra, and a loaded driver). It runs
    one ``NvmlProbe`` actor per GPU on an actor system of its own (an event
    loop on a daemon thread); each samples every ``interval_secs`` into
    ``latest``. ``read`` asks them all for a fresh sample; a figure a GPU does
    not report is None. ``close()`` (or ``with``) stops the probes.
    """

    def __init__(self, interval_secs: float = 1.0) -> None:
        self.interval_secs = _positive("interval_secs", interval_secs)
        """Seconds between the probes' own samples (what ``latest`` holds)."""
        count = _gpu_count()
        self._samples: dict[int, NvmlSample] = {}
        self._closed = False
        self._thread = LoopThread("nvml")
        self._portal = Portal(self._thread.loop)
        self._actors = ActorSystem("nvml")
        self._portal.call(self._actors.__aenter__())

        async def spawn() -> list[ActorRef]:
            return [self._actors.spawn(
                Props(NvmlProbe, index, self.interval_secs, self._keep), f"nvml-{index}")
                for index in range(count)]

        self._probes = self._portal.call(spawn())

    def _keep(self, sample: NvmlSample) -> None:
        self._samples[sample.index] = sample

    @staticmethod
    def _snapshot(samples: list[NvmlSample]) -> dict[str, Any]:
        return {"devices": [device_reading(s) for s in sorted(samples, key=lambda s: s.index)],
                "generated_at_unix_nanos": time.time_ns()}

    async def _ask_all(self, timeout: float) -> list[NvmlSample]:
        try:
            return list(await asyncio.gather(
                *(probe.ask(GetSample(), timeout=timeout) for probe in self._probes)))
        except actor.AskTimeout as exc:
            raise AskTimeout(exc.path, timeout) from exc

    def read(self, timeout_secs: float = 2.0) -> dict[str, Any]:
        """A fresh reading of every GPU: ``{"devices": [...], "generated_at_unix_nanos": t}``.

        Each device: ``device_index, uuid, name, power_milliwatts,
        temperature_gpu_c, clock_sm_mhz, clock_mem_mhz, mem_total_bytes,
        mem_used_bytes``. ``AskTimeout`` when NVML does not answer within
        ``timeout_secs``; ``SystemClosed`` after ``close``.
        """
        timeout = _positive("timeout_secs", timeout_secs)
        return self._snapshot(self._portal.call(self._ask_all(timeout)))

    def power_w(self, timeout_secs: float = 2.0) -> float | None:
        """The board power of all GPUs together, in watts, read now; None when no GPU
        reports its power."""
        timeout = _positive("timeout_secs", timeout_secs)
        powers = [s.power_watts for s in self._portal.call(self._ask_all(timeout))
                  if s.power_watts is not None]
        return sum(powers) if powers else None

    @property
    def latest(self) -> dict[str, Any] | None:
        """The probes' newest timer samples, in ``read``'s shape, without asking NVML;
        None until every GPU has been sampled once."""
        samples = list(self._samples.values())
        if len(samples) < len(self._probes) or not samples:
            return None
        return self._snapshot(samples)

    def close(self) -> None:
        """Stop the probes and their event loop; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._portal.call(self._actors.__aexit__(None, None, None))
        self._portal.close()
        self._thread.stop()

    def __repr__(self) -> str:
        return f"NvmlActor(interval_secs={self.interval_secs}, gpus={len(self._probes)})"
