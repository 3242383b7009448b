"""Context hosts: where a device context lives (``thread``, ``process`` or ``ray``)."""

from atomr_accel.hosts._base import BackendSpec, ContextHost
from atomr_accel.hosts._process import ProcessHost
from atomr_accel.hosts._ray import RayHost
from atomr_accel.hosts._thread import ThreadHost

__all__ = ["BackendSpec", "ContextHost", "ProcessHost", "RayHost", "ThreadHost"]
