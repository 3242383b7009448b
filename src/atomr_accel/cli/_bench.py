"""``atomr-accel bench``: find the benchmark scripts and run them, each printing its tables,
under a progress line; ``--json PATH`` gathers them all in one report."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import atomr_accel
from atomr_accel.backends import cuda_device_count
from atomr_accel.cli._checkout import candidate_folders

__all__ = ["SKIP_STATUS", "PlannedBenchmark", "find_benchmarks", "plan_benchmarks",
           "run_benchmarks"]


def find_benchmarks(path: str | Path | None = None) -> Path | None:
    """The folder of benchmark scripts: ``path``, else the package's own (``benchmarks/``
    of the checkout this package runs from, never the current directory's); None
    when none holds a script.

    The scripts are not part of the installed package: a wheel install needs a
    checkout and ``--path``.
    """
    for folder in candidate_folders(path, "benchmarks"):
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


SKIP_STATUS = 77
"""The exit status of a benchmark that cannot run on this machine (it needs a GPU, an
optional library): ``atomr-accel bench`` reports it ``skipped``, not failed."""


@dataclass(frozen=True)
class PlannedBenchmark:
    """One script of a run: how it will be started, or why it will not."""

    script: Path
    args: tuple[str, ...]
    """Its arguments after the script's path (``--quick``, ``--json PATH``)."""
    skip: str | None
    """Why it is skipped without being started; None when it runs."""
    note: str
    """What to say beside its name (``(it has no --quick: full run)``)."""


def _accepts(text: str, option: str) -> bool:
    return f'"{option}"' in text or (option == "--quick" and "add_quick(" in text)


def plan_benchmarks(folder: Path, names: Sequence[str] = (), *, quick: bool = False,
                    report_dir: Path | None = None) -> list[PlannedBenchmark]:
    """The scripts of ``folder`` whose name contains one of ``names`` (all by default), in
    order, each with its arguments: ``--quick`` for those that take it when ``quick``;
    ``--json`` into ``report_dir`` for those that take it. Scripts named ``gpu_*`` are
    skipped without a CUDA device; others that need what is missing skip themselves
    when run (exit status ``SKIP_STATUS``)."""
    gpus = cuda_device_count()
    planned = []
    for script in _scripts(folder):
        if names and not any(n in script.stem for n in names):
            continue
        text = script.read_text()
        args: list[str] = []
        note = ""
        if quick:
            if _accepts(text, "--quick"):
                args.append("--quick")
            else:
                note = " (it has no --quick: full run)"
        if report_dir is not None and _accepts(text, "--json"):
            args += ["--json", str(report_dir / f"{script.stem}.json")]
        skip = "needs a CUDA device" if script.name.startswith("gpu_") and gpus == 0 else None
        planned.append(PlannedBenchmark(script, tuple(args), skip, note))
    return planned


def run_benchmarks(out: IO[str], names: Sequence[str] = (), *, quick: bool = False,
                   path: str | Path | None = None, json_path: str | Path | None = None,
                   dry_run: bool = False) -> int:
    """Run the benchmark scripts (those whose name contains one of ``names``; all by
    default) one after another from the folder's parent, each under a progress line
    (``[n/N]``, the time elapsed so far); return 0 when none fails.

    ``quick`` passes ``--quick`` to the scripts that accept it (every script of
    the package's own folder does). Scripts named ``gpu_*`` are skipped without a
    CUDA device, and a script that exits with ``SKIP_STATUS`` (a GPU-only one
    where none is visible) counts as skipped, with the line it printed. With
    ``json_path``, one JSON report is written there: per benchmark its status,
    exit code, seconds, the tables it printed and the JSON report of scripts that
    take ``--json``. ``dry_run`` prints the plan (each script and its arguments,
    or why it skips) and runs nothing. Returns 2 when no benchmark folder or no
    matching script is found.
    """
    folder = find_benchmarks(path)
    if folder is None:
        looked = ", ".join(str(p) for p in candidate_folders(path, "benchmarks")) or "no checkout"
        print(f"no benchmark scripts found (looked in: {looked}); they live in the "
              "benchmarks/ folder of a source checkout: pass it with --path", file=out)
        return 2
    with tempfile.TemporaryDirectory(prefix="atomr-bench-") as scratch:
        report_dir = Path(scratch) if json_path is not None else None
        planned = plan_benchmarks(folder, names, quick=quick, report_dir=report_dir)
        if not planned:
            print(f"no benchmark in {folder} matches {', '.join(names)}", file=out)
            return 2
        if dry_run:
            for item in planned:
                how = f"skipped ({item.skip})" if item.skip else \
                    " ".join([item.script.name, *item.args]) + item.note
                print(f"{item.script.name}: {how}", file=out)
            return 0
        rows, total = _run_all(planned, folder, out)
    return _summarize(rows, total, quick, json_path, out)


def _run_all(planned: list[PlannedBenchmark], folder: Path,
             out: IO[str]) -> tuple[list[dict[str, Any]], float]:
    """Run each planned script; return a row per script and the seconds it all took."""
    rows: list[dict[str, Any]] = []
    began = time.perf_counter()
    for index, item in enumerate(planned, 1):
        name = item.script.name
        where = f"[{index}/{len(planned)}, {time.perf_counter() - began:.0f} s elapsed]"
        result: dict[str, Any] = {"name": name, "status": "skipped", "exit_code": None,
                                  "seconds": 0.0, "output": "", "report": None}
        rows.append(result)
        if item.skip is not None:
            print(f"\n== {name}: skipped ({item.skip})  {where}", file=out)
            continue
        print(f"\n== {name}{item.note}  {where}", file=out, flush=True)
        started = time.perf_counter()
        code, output = _run_script([sys.executable, str(item.script), *item.args],
                                   folder.parent, out)
        seconds = time.perf_counter() - started
        status = "ok" if code == 0 else "skipped" if code == SKIP_STATUS else "failed"
        report = Path(item.args[item.args.index("--json") + 1]) \
            if "--json" in item.args else None
        result.update(status=status, exit_code=code, seconds=round(seconds, 3),
                      output=output, report=None if report is None else _report(report))
        if status == "failed":
            print(f"== {name} exited with status {code}", file=out)
        else:
            print(f"== {name}: {status} in {seconds:.1f} s", file=out)
    return rows, time.perf_counter() - began


def _summarize(rows: list[dict[str, Any]], total: float, quick: bool,
               json_path: str | Path | None, out: IO[str]) -> int:
    counts = {status: sum(r["status"] == status for r in rows)
              for status in ("ok", "skipped", "failed")}
    print(f"\n{len(rows)} benchmarks in {total:.1f} s: "
          + ", ".join(f"{n} {status}" for status, n in counts.items()), file=out)
    if json_path is not None:
        _write_report(Path(json_path), rows, quick, total, out)
    failed = [r["name"] for r in rows if r["status"] == "failed"]
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
