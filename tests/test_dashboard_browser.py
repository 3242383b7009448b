"""The dashboard page in a real headless browser (Debian's chromium, driven by Playwright).

Skips when Playwright or ``/usr/bin/chromium`` is missing, unless
``ATOMR_REQUIRE_BROWSER=1`` (CI sets it), where that is a failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atomr_accel import ContextPoisoned, FaultKind, System

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing(why: str) -> None:
    if os.environ.get("ATOMR_REQUIRE_BROWSER") == "1":
        pytest.fail(f"ATOMR_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless chromium, launched through Playwright."""
    pytest.importorskip("prometheus_client")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (the test extra)")
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"{CHROMIUM} is missing (apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where the screenshot goes: ``$ATOMR_TEST_ARTIFACTS``, else pytest's tmp dir."""
    folder = Path(os.environ.get("ATOMR_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cell(name: str, field: str) -> str:
    return f'#devices tr[data-device="{name}"] td[data-field="{field}"]'


def test_page_shows_each_device_and_a_rebuild_within_two_seconds(
        browser: Any, artifacts: Path) -> None:
    with System.open("browser") as system:
        devices = [system.spawn_device(mock=True, name="left"),
                   system.spawn_device(mock=True, name="right", isolation="process")]
        port = system.serve_dashboard()
        page = browser.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_function("document.querySelectorAll('#devices tbody tr').length === 2",
                               timeout=10_000)
        rows = page.eval_on_selector_all("#devices tbody tr", "rows => rows.map(r => "
                                         "r.dataset.device)")
        assert rows == ["left", "right"]
        for dev in devices:
            stats = dev.stats()
            name = dev.ref.name
            assert page.inner_text(cell(name, "generation")) == str(stats.generation)
            assert page.inner_text(cell(name, "restarts")) == "0"
            assert page.inner_text(cell(name, "status")) == "ready"
            assert page.inner_text(cell(name, "backend")) == "cpu"
        before = devices[0].stats().generation

        with pytest.raises(ContextPoisoned):
            devices[0].inject_fault(FaultKind.POISON)
        injected = time.monotonic()
        page.wait_for_function(
            """([gen, restarts, generation]) =>
                 document.querySelector(gen)?.textContent === String(generation) &&
                 document.querySelector(restarts)?.textContent === "1" """,
            arg=[cell("left", "generation"), cell("left", "restarts"), before + 1],
            timeout=max(1.0, 2.0 - (time.monotonic() - injected)) * 1000, polling=50)
        assert page.inner_text(cell("right", "generation")) == str(devices[1].stats().generation)
        page.wait_for_selector("#events li.kind-context_down", timeout=2_000)
        page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
        assert (artifacts / "dashboard.png").stat().st_size > 0
        page.close()
        assert problems == []
