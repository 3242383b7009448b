"""The original package's ``atomr_accel.graph``: ``GraphScript``, ``GraphCapture``,
``GraphHandle`` (real graphs here; the original's were a mock)."""

from atomr_accel.facade._graph_script import GraphCapture, GraphHandle, GraphScript

__all__ = ["GraphCapture", "GraphHandle", "GraphScript"]
