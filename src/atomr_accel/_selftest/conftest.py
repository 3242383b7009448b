"""The smoke suite's ``gpu`` marker: its tests are skipped where no CUDA device is visible."""

from __future__ import annotations

import pytest

from atomr_accel.backends import cuda_device_count


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``gpu`` marker (the suite may run without the checkout's settings)."""
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``gpu`` tests on machines without a CUDA device."""
    if cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (CuPy and a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
