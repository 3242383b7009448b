"""``atomr-accel bench``: find the benchmark scripts and run them, each printing its tables,
under a progress line; ``--json PATH`` gathers them all in one report."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import atomr_accel
from atomr_accel.backends import cuda_device_count
from atomr_accel.cli._checkout import checkout_folder

__all__ = ["find_benchmarks", "run_benchmarks"]


def _candidates(path: str | Path | None) -> list[Path]:
    if path is not None:
        return [Path(path)]
    own = checkout_folder("benchmarks")
    return [] if own is None else [own]


def find_benchmarks(path: str | Path | None = None) -> Path | None:
    """The folder of benchmark scripts: ``path``, else the package's own (``benchmarks/``
    of the checkout this package runs from, never the current directory's); None
    when none holds a script.

    The scripts are not part of the installed package: a wheel install needs a
    checkout and ``--path``.
    """
    for folder in _candidates(path):
        if folder.is_dir() and any(_scripts(folder)):
            return folder.resolve()
    return None


def _scripts(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def _run_script(args: list[str], cwd: Path, out: IO[str]) -> tuple[int, str]:
    """Run a script, echoing its standard output to ``out`` line by line; return its exit
    status and that output."""
    lines: list[str] = []
    with subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, text=True,
                          bufsize=1) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            out.write(line)
            out.flush()
    return process.returncode, "".join(lines)


def _report(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_benchmarks(out: IO[str], names: Sequence[str] = (), *, quick: bool = False,
                   path: str | Path | None = None, json_path: str | Path | None = None) -> int:
    """Run the benchmark scripts (those whose name contains one of ``names``; all by
    default) one after another from the folder's parent, each under a progress line
    (``[n/N]``, the time elapsed so far); return 0 when all succeed.

    ``quick`` passes ``--quick`` to the scripts that accept it. Scripts named
    ``gpu_*`` are skipped without a CUDA device. With ``json_path``, one JSON
    report is written there: per benchmark its status, exit code, seconds, the
    tables it printed and the JSON report of scripts that take ``--json``.
    Returns 2 when no benchmark folder or no matching script is found.
    """
    folder = find_benchmarks(path)
    if folder is None:
        looked = ", ".join(str(p) for p in _candidates(path)) or "no checkout"
        print(f"no benchmark scripts found (looked in: {looked}); they live in the "
              "benchmarks/ folder of a source checkout: pass it with --path", file=out)
        return 2
    scripts = [s for s in _scripts(folder) if not names or any(n in s.stem for n in names)]
    if not scripts:
        print(f"no benchmark in {folder} matches {', '.join(names)}", file=out)
        return 2
    gpus = cuda_device_count()
    failed: list[str] = []
    results: list[dict[str, Any]] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="atomr-bench-") as scratch:
        for index, script in enumerate(scripts, 1):
            where = f"[{index}/{len(scripts)}, {time.perf_counter() - began:.0f} s elapsed]"
            result: dict[str, Any] = {"name": script.name, "status": "skipped",
                                      "exit_code": None, "seconds": 0.0, "output": "",
                                      "report": None}
            results.append(result)
            if script.name.startswith("gpu_") and gpus == 0:
                print(f"\n== {script.name}: skipped (needs a CUDA device)  {where}", file=out)
                continue
            args = [sys.executable, str(script)]
            text = script.read_text()
            note = ""
            if quick:
                if '"--quick"' in text:
                    args.append("--quick")
                else:
                    note = " (it has no --quick: full run)"
            report = Path(scratch) / f"{script.stem}.json"
            if json_path is not None and '"--json"' in text:
                args += ["--json", str(report)]
            print(f"\n== {script.name}{note}  {where}", file=out, flush=True)
            started = time.perf_counter()
            code, output = _run_script(args, folder.parent, out)
            seconds = time.perf_counter() - started
            result.update(status="ok" if code == 0 else "failed", exit_code=code,
                          seconds=round(seconds, 3), output=output, report=_report(report))
            if code != 0:
                print(f"== {script.name} exited with status {code}", file=out)
                failed.append(script.name)
            else:
                print(f"== {script.name}: ok in {seconds:.1f} s", file=out)
    total = time.perf_counter() - began
    counts = {status: sum(r["status"] == status for r in results)
              for status in ("ok", "skipped", "failed")}
    print(f"\n{len(scripts)} benchmarks in {total:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items()), file=out)
    if json_path is not None:
        _write_report(Path(json_path), results, quick, total, out)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=out)
        return 1
    return 0


def _write_report(path: Path, results: list[dict[str, Any]], quick: bool, seconds: float,
                  out: IO[str]) -> None:
    from atomr_accel.cli._probe import probe

    machine = probe()
    payload = {
        "atomr_accel": atomr_accel.__version__,
        "python": machine["python"],
        "platform": machine["platform"],
        "cuda": machine["backends"]["cuda"],
        "quick": quick,
        "seconds": round(seconds, 3),
        "benchmarks": results,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    print(f"wrote {path}", file=out)
