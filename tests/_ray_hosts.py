"""The Ray host as one more parameter of host-parametrized tests (skipped without Ray).

A test that takes ``RAY`` spawns its device with ``isolation="ray"``; the first
one starts a local Ray for the test session (``RayHost.start``), which exits
with the session.
"""

from __future__ import annotations

import importlib.util

import pytest

HAVE_RAY = importlib.util.find_spec("ray") is not None

RAY = pytest.param("ray", marks=[
    pytest.mark.ray,
    pytest.mark.skipif(not HAVE_RAY, reason="needs Ray: pip install 'atomr-accel-py[ray]'"),
])
"""``"ray"``, marked ``ray`` and skipped cleanly where Ray is not installed."""
