"""Training blueprints (temporary local export list until train-core lands)."""

from atomr_accel.train._parameter_server import (
    AsyncParameterServer,
    ParameterServerCounters,
    ParameterServerStats,
)
from atomr_accel.train._staleness import StaleGradient

__all__ = [
    "AsyncParameterServer", "ParameterServerCounters", "ParameterServerStats", "StaleGradient",
]
