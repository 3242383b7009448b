"""Shared fixtures: async tests run on asyncio in debug mode through anyio's plugin.

Tests marked ``gpu`` are skipped where no CUDA device is visible.
"""

from __future__ import annotations

import faulthandler
import importlib.util
from collections.abc import Iterator

import pytest

from atomr_accel._selftest import conftest as gpu_marker


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio with debug checks on."""
    return ("asyncio", {"debug": True})


pytest_collection_modifyitems = gpu_marker.pytest_collection_modifyitems
"""Skip GPU tests cleanly on machines without a CUDA device (the hook the smoke suite
shipped in the package uses too)."""


@pytest.fixture(scope="session", autouse=True)
def _ray_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """Start one local Ray for the session when a collected test is marked ``ray`` (and Ray
    is installed), before any test counts threads or processes; shut it down at the end."""
    session = request.session
    wanted = any("ray" in item.keywords for item in session.items)
    if not wanted or importlib.util.find_spec("ray") is None:
        yield
        return
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Never hang at exit: a failed test may leave a plain thread of its own blocked for
    ever, which Python waits for before it exits. Past two minutes, every thread's stack
    is printed and the process exits (code 1)."""
    faulthandler.dump_traceback_later(120, exit=True)
