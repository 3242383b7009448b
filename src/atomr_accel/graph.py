"""The original package's ``atomr_accel.graph``: ``GraphScript``,
``GraphCapture``, ``GraphHandle`` (real graphs here; the original's were a mock).

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import GraphCapture, GraphHandle, GraphScript
from atomr_accel._public import publish as _publish

__all__ = ["GraphCapture", "GraphHandle", "GraphScript"]

_publish(__name__)
