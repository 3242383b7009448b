"""Shared fixtures: async tests run on asyncio in debug mode through anyio's plugin.

Tests marked ``gpu`` are skipped where no CUDA device is visible.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from atomr_accel._selftest import conftest as gpu_marker


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio with debug checks on."""
    return ("asyncio", {"debug": True})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests cleanly on machines without a CUDA device (the hook the smoke suite
    shipped in the package uses too), and keep the tests marked ``ray`` together.

    Under pytest-xdist (``-n N --dist loadgroup``, the README's test command) the
    ``ray`` tests share one group, so one worker runs them all and starts the one
    local Ray; the other workers never start one.
    """
    gpu_marker.pytest_collection_modifyitems(config, items)
    for item in items:
        if "ray" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(autouse=True)
def _ray_for_ray_tests(request: pytest.FixtureRequest) -> None:
    """Give a test marked ``ray`` the session's local Ray (started by the first such test
    this process runs); other tests start nothing."""
    if "ray" in request.keywords:
        request.getfixturevalue("_ray_session")


@pytest.fixture(scope="session")
def _ray_session() -> Iterator[None]:
    """Start one local Ray (when Ray is installed) for the rest of the session; shut it
    down at the end. It starts between tests, never while a test counts threads or
    processes."""
    if importlib.util.find_spec("ray") is None:
        yield
        return
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()
