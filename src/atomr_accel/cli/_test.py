"""``atomr-accel test``: run the package's own test suites with pytest, skipping what the
machine lacks (GPU tests without a CUDA device, optional libraries that are missing).

The full suites are the checkout's ``tests/`` (beside the source tree an
editable install runs from, or the folder given with ``--path``); an installed
wheel has no checkout, so it runs the smoke suite shipped in the package
(``atomr_accel._selftest``).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from atomr_accel.backends import cuda_device_count
from atomr_accel.cli._checkout import candidate_folders

__all__ = ["find_tests", "run_tests"]

NO_PYTEST = 2
"""The exit status when pytest is not installed (as for a usage error)."""


def _suites(folder: Path) -> list[Path]:
    return sorted(folder.glob("test_*.py"))


def find_tests(path: str | Path | None = None) -> Path | None:
    """The test folder: ``path``, else the package's own (``tests/`` of the checkout this
    package runs from, never the current directory's); None when none holds a
    ``test_*.py``."""
    for folder in candidate_folders(path, "tests"):
        if folder.is_dir() and _suites(folder):
            return folder.resolve()
    return None


def run_tests(out: IO[str], suites: Sequence[str] = (), *, gpu: bool = False,
              smoke: bool = False, path: str | Path | None = None,
              keyword: str | None = None, exit_first: bool = False) -> int:
    """Run the test suites whose file name contains one of ``suites`` (all by default) in
    a pytest subprocess; return pytest's exit status.

    ``gpu`` runs the GPU tests (``-m gpu``) instead of the others; without a
    CUDA device they are reported as skipped. ``smoke`` (or no checkout found)
    runs the shipped smoke suite. ``keyword`` and ``exit_first`` are pytest's
    ``-k`` and ``-x``. Returns 2 when pytest is missing, 4 (pytest's usage
    error) when no suite matches.
    """
    if importlib.util.find_spec("pytest") is None:
        print("atomr-accel test needs pytest: pip install 'atomr-accel-py[test]'", file=out)
        return NO_PYTEST
    folder = None if smoke else find_tests(path)
    if folder is None:
        if path is not None and not smoke:
            print(f"no test_*.py in {path}", file=out)
            return 4
        from atomr_accel import _selftest

        folder = Path(_selftest.__file__).resolve().parent
        why = "as asked" if smoke else "no checkout tests/ found (an installed package)"
        print(f"running the smoke suite shipped in the package ({why}): {folder}", file=out)
        cwd = folder
    else:
        print(f"running the suites of {folder}", file=out)
        cwd = folder.parent
    files = [f for f in _suites(folder) if not suites or any(s in f.stem for s in suites)]
    if not files:
        print(f"no suite in {folder} matches {', '.join(suites)}", file=out)
        return 4
    gpus = cuda_device_count()
    if gpu and gpus == 0:
        print("no CUDA device visible: the GPU tests will be skipped", file=out)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "-m", "gpu" if gpu else "not gpu", *(str(f) for f in files)]
    if keyword is not None:
        args += ["-k", keyword]
    if exit_first:
        args.append("-x")
    print(f"{len(files)} suite(s), {'GPU' if gpu else 'CPU'} tests; {gpus} CUDA device(s)",
          file=out, flush=True)
    return subprocess.run(args, cwd=cwd, check=False).returncode
