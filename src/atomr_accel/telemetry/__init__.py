"""Telemetry: Prometheus metrics, NVTX ranges, an NVML probe actor and structured logging.

``system.enable_telemetry(port=...)`` collects and serves a system's metrics
(needs the ``telemetry`` extra: ``prometheus-client``, ``nvidia-ml-py``);
``nvtx_range(name)`` marks host work for Nsight; ``configure_logging()``
prints the package's structured log records. See ``docs/operations.md``.
``system.serve_dashboard(port=...)`` serves a live ``Dashboard`` page beside
``/metrics`` (``docs/dashboard.md``).
"""

from atomr_accel.telemetry._dashboard import Dashboard, StatsSource
from atomr_accel.telemetry._events import EVENT_KINDS
from atomr_accel.telemetry._logging import LOGGERS, configure_logging
from atomr_accel.telemetry._metrics import LATENCY_BUCKETS, DeviceCollector, OpMetrics
from atomr_accel.telemetry._nvml import GetSample, NvmlProbe, NvmlSample
from atomr_accel.telemetry._nvtx import nvtx_range
from atomr_accel.telemetry._telemetry import Telemetry

__all__ = [
    "EVENT_KINDS",
    "LATENCY_BUCKETS",
    "LOGGERS",
    "Dashboard",
    "DeviceCollector",
    "GetSample",
    "NvmlProbe",
    "NvmlSample",
    "OpMetrics",
    "StatsSource",
    "Telemetry",
    "configure_logging",
    "nvtx_range",
]
