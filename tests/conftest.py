"""Shared fixtures: async tests run on asyncio in debug mode through anyio's plugin.

Tests marked ``gpu`` are skipped where no CUDA device is visible.
"""

from __future__ import annotations

import pytest

from atomr_accel.backends import cuda_device_count


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio with debug checks on."""
    return ("asyncio", {"debug": True})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests cleanly on machines without a CUDA device."""
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (CuPy and a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
