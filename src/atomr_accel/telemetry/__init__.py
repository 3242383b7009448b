"""Telemetry: Prometheus metrics, NVTX ranges, an NVML probe actor and structured logging.

``system.enable_telemetry(port=...)`` collects and serves a system's metrics
(needs the ``telemetry`` extra: ``prometheus-client``, ``nvidia-ml-py``);
``nvtx_range(name)`` marks host work for Nsight; ``configure_logging()``
prints the package's structured log records. See ``docs/operations.md``.
``system.serve_dashboard(port=...)`` serves a live ``Dashboard`` page beside
``/metrics`` (``docs/dashboard.md``).
The original's names: ``CuptiSession`` (CUPTI kernel tracing), ``NvtxKernelTrace``,
``NvmlActor``; ``trace_ops`` and ``write_chrome_trace`` put op spans and CUPTI
records on one Perfetto timeline (``docs/tracing.md``).
"""

from atomr_accel.telemetry._chrome_trace import chrome_trace, write_chrome_trace
from atomr_accel.telemetry._cupti import CATEGORIES, DEFAULT_CATEGORIES, CuptiSession
from atomr_accel.telemetry._dashboard import Dashboard, DeviceSection, StatsSource
from atomr_accel.telemetry._events import EVENT_KINDS
from atomr_accel.telemetry._logging import LOGGERS, configure_logging
from atomr_accel.telemetry._metrics import LATENCY_BUCKETS, DeviceCollector, OpMetrics
from atomr_accel.telemetry._nvml import GetSample, NvmlProbe, NvmlSample
from atomr_accel.telemetry._nvml_actor import NvmlActor
from atomr_accel.telemetry._nvtx import NvtxKernelTrace, nvtx_range
from atomr_accel.telemetry._ops_trace import OpSpan, OpTracer, trace_ops
from atomr_accel.telemetry._telemetry import Telemetry

__all__ = [
    "CATEGORIES",
    "DEFAULT_CATEGORIES",
    "EVENT_KINDS",
    "LATENCY_BUCKETS",
    "LOGGERS",
    "CuptiSession",
    "Dashboard",
    "DeviceCollector",
    "DeviceSection",
    "GetSample",
    "NvmlActor",
    "NvmlProbe",
    "NvmlSample",
    "NvtxKernelTrace",
    "OpMetrics",
    "OpSpan",
    "OpTracer",
    "StatsSource",
    "Telemetry",
    "chrome_trace",
    "configure_logging",
    "nvtx_range",
    "trace_ops",
    "write_chrome_trace",
]
