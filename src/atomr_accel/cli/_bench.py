"""``atomr-accel bench``: find the benchmark scripts and run them, each printing its tables."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import atomr_accel
from atomr_accel.backends import cuda_device_count

__all__ = ["find_benchmarks", "run_benchmarks"]


def _candidates(path: str | Path | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    source_tree = Path(atomr_accel.__file__).resolve().parents[2]  # src/atomr_accel/ -> repo
    return [Path.cwd() / "benchmarks", source_tree / "benchmarks"]


def find_benchmarks(path: str | Path | None = None) -> Path | None:
    """The folder of benchmark scripts: ``path``, else ``./benchmarks``, else the one
    beside the source tree this package runs from; None when none holds a script.

    The scripts are not part of the installed package: a wheel install needs a
    checkout and ``--path``.
    """
    for folder in _candidates(path):
        if folder.is_dir() and any(_scripts(folder)):
            return folder.resolve()
    return None


def _scripts(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def run_benchmarks(out: IO[str], names: Sequence[str] = (), *, quick: bool = False,
                   path: str | Path | None = None) -> int:
    """Run the benchmark scripts (those whose name contains one of ``names``; all by
    default) one after another from the folder's parent; return 0 when all succeed.

    ``quick`` passes ``--quick`` to the scripts that accept it. Scripts named
    ``gpu_*`` are skipped without a CUDA device. Returns 2 when no benchmark
    folder or no matching script is found.
    """
    folder = find_benchmarks(path)
    if folder is None:
        looked = ", ".join(str(p) for p in _candidates(path))
        print(f"no benchmark scripts found (looked in {looked}); they live in the "
              "benchmarks/ folder of a source checkout: run from there or pass --path",
              file=out)
        return 2
    scripts = [s for s in _scripts(folder) if not names or any(n in s.stem for n in names)]
    if not scripts:
        print(f"no benchmark in {folder} matches {', '.join(names)}", file=out)
        return 2
    gpus = cuda_device_count()
    failed: list[str] = []
    for script in scripts:
        if script.name.startswith("gpu_") and gpus == 0:
            print(f"\n== {script.name}: skipped (needs a CUDA device)", file=out)
            continue
        args = [sys.executable, str(script)]
        note = ""
        if quick:
            if '"--quick"' in script.read_text():
                args.append("--quick")
            else:
                note = " (it has no --quick: full run)"
        print(f"\n== {script.name}{note}", file=out, flush=True)
        code = subprocess.run(args, cwd=folder.parent, check=False).returncode
        if code != 0:
            print(f"== {script.name} exited with status {code}", file=out)
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=out)
        return 1
    return 0
