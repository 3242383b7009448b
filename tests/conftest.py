"""Shared fixtures: async tests run on asyncio in debug mode through anyio's plugin."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, bool]]:
    """Run ``@pytest.mark.anyio`` tests on asyncio with debug checks on."""
    return ("asyncio", {"debug": True})
