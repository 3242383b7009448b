"""Where a context's worker process and a Ray session come from.

A process-host worker must not import from the caller's current directory (a
``numpy.py`` planted in a shared folder would run in every device worker), and
``ensure_ray(None)`` must start a new local Ray rather than join whatever
cluster Ray last knew on the machine.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import atomr_accel
from atomr_accel.hosts import _ray

APP = """
import numpy as np
from atomr_accel import System
with System.open("planted") as s:
    d = s.spawn_device(0, mock=True, isolation="process")
    b = d.allocate_f64(4)
    d.copy_from_numpy(b, np.arange(4.0))
    print(d.copy_to_numpy(b).sum())
"""


def test_a_worker_does_not_import_from_the_callers_directory(tmp_path: Path) -> None:
    shared, app = tmp_path / "shared", tmp_path / "app"
    shared.mkdir()
    app.mkdir()
    marker = shared / "PLANTED_CODE_RAN"
    (shared / "numpy.py").write_text(f"open({str(marker)!r}, 'a').write('ran')\n"
                                     "raise ImportError('planted')\n")
    (app / "app.py").write_text(textwrap.dedent(APP))
    root = str(Path(atomr_accel.__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, str(app / "app.py")], cwd=shared, timeout=120,
                          capture_output=True, text=True, env={"PYTHONPATH": root},
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "6.0"
    assert not marker.exists()


class _FakeRay:
    """The two names of the ``ray`` module ``ensure_ray`` uses, recording ``init``."""

    def __init__(self) -> None:
        self.inits: list[dict[str, Any]] = []

    def is_initialized(self) -> bool:
        return bool(self.inits)

    def init(self, **options: Any) -> None:
        self.inits.append(options)


@pytest.mark.parametrize(("address", "passed"), [
    (None, "local"), ("local", "local"), ("auto", "auto"), ("10.0.0.1:6379", "10.0.0.1:6379")])
def test_ensure_ray_none_starts_a_new_local_ray(
        monkeypatch: pytest.MonkeyPatch, address: str | None, passed: str) -> None:
    fake = _FakeRay()
    monkeypatch.setattr(_ray, "ray_module", lambda: fake)
    assert _ray.ensure_ray(address) == (fake, True)
    assert [i["address"] for i in fake.inits] == [passed]
    assert _ray.ensure_ray(address) == (fake, False)
    assert len(fake.inits) == 1
