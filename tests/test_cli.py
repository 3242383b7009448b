"""The ``atomr-accel`` command: probe, demo and bench, in-process and as ``python -m``."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from atomr_accel.backends import cuda_device_count
from atomr_accel.cli import main

LIBRARIES = ["cupy", "nvmath", "cudnn", "libcudnn", "cuda.compute", "cuda.cccl",
             "cuda.bindings", "nccl", "cutensor", "cupti", "libcupti", "onnxruntime", "pynvml",
             "ray", "prometheus_client"]


def test_probe_reports_backends_devices_and_libraries(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    for heading in ("backends", "devices", "libraries"):
        assert f"\n{heading}\n" in out
    for name in LIBRARIES:
        assert f"  {name} " in out
    if cuda_device_count() == 0:
        assert "cuda     not available" in out and "no GPU" in out
    else:
        assert "compute capability" in out


def test_probe_json_says_what_is_installed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backends"]["cpu"]["available"] is True
    assert report["backends"]["cuda"]["available"] is (cuda_device_count() > 0)
    assert len(report["backends"]["cuda"]["devices"]) == cuda_device_count()
    libraries = {lib["name"]: lib for lib in report["libraries"]}
    assert list(libraries) == LIBRARIES
    prometheus = libraries["prometheus_client"]  # in the test extra
    assert prometheus["found"] and \
        prometheus["version"] == importlib.metadata.version("prometheus-client")


def test_demo_runs_checks_and_recovers_a_fault(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("atomr_accel")
    handlers, level = list(logger.handlers), logger.level
    assert main(["-v", "demo", "--backend", "cpu"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "CPU backend" in out
    assert "all 8 steps passed" in out
    for step in ("gemm", "FFT", "RNG", "solver", "typed errors", "fault injected + recovered",
                 "placement"):
        assert f"] {step}" in out and f"  {step}" in out  # a progress line and a table row
    assert out.count(" ... ok (") == 8
    assert "generation 2, old buffers refused" in out
    assert "context_down x1" in out
    assert "event=context_down" in captured.err  # -v: the structured log records
    assert (logger.handlers, logger.level) == (handlers, level)  # the CLI left logging as it was


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "atomr_accel", "probe"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("atomr-accel ") and "libraries" in done.stdout


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "probe" in capsys.readouterr().out


@pytest.fixture
def bench_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # where bench --quick writes its report (atomr-bench.json)
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "fast_bench.py").write_text(
        "import argparse\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--quick", action="store_true")\n'
        'print(f"fast quick={parser.parse_args().quick}")\n')
    (folder / "plain_bench.py").write_text('print("plain ran")\n')
    (folder / "gpu_bench.py").write_text('print("gpu ran")\n')
    (folder / "_helpers.py").write_text('raise SystemExit("helpers are not benchmarks")\n')
    return folder


def test_bench_runs_each_script_and_passes_quick_where_accepted(
        bench_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--path", str(bench_dir)]) == 0
    out = capfd.readouterr().out
    assert "wrote atomr-bench.json" in out
    assert json.loads((bench_dir.parent / "atomr-bench.json").read_text())["quick"] is True
    assert "fast quick=True" in out and "plain ran" in out
    assert "== plain_bench.py (it has no --quick: full run)" in out
    assert "helpers" not in out
    if cuda_device_count() == 0:
        assert "gpu_bench.py: skipped (needs a CUDA device)" in out and "gpu ran" not in out
    assert main(["bench", "fast", "--path", str(bench_dir)]) == 0
    out = capfd.readouterr().out
    assert "fast quick=False" in out and "plain" not in out


def test_bench_reports_failures_and_missing_benchmarks(
        bench_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (bench_dir / "broken_bench.py").write_text("raise SystemExit(3)\n")
    assert main(["bench", "broken", "--path", str(bench_dir)]) == 1
    assert "broken_bench.py exited with status 3" in capfd.readouterr().out
    assert main(["bench", "--path", str(bench_dir / "missing")]) == 2
    assert "no benchmark scripts found" in capfd.readouterr().out
    assert main(["bench", "nothing-matches", "--path", str(bench_dir)]) == 2


def test_bench_finds_the_repository_benchmarks_without_a_path() -> None:
    from atomr_accel.cli import find_benchmarks

    folder = find_benchmarks()
    assert folder is not None and (folder / "device_bench.py").is_file()


def test_bench_plan_covers_every_script_and_each_takes_quick(
        capsys: pytest.CaptureFixture[str]) -> None:
    from atomr_accel.cli import find_benchmarks, plan_benchmarks

    folder = find_benchmarks()
    assert folder is not None
    scripts = sorted(p.name for p in folder.glob("*.py") if not p.name.startswith("_"))
    planned = plan_benchmarks(folder, quick=True)
    assert [item.script.name for item in planned] == scripts
    for item in planned:
        assert "--quick" in item.args and item.note == "", item.script.name
    assert main(["bench", "--list", "--quick"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in listed] == scripts
    for line in listed:
        assert "--quick" in line or "skipped (needs a CUDA device)" in line, line


def test_bench_counts_a_script_that_skips_itself_as_skipped(
        bench_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    from atomr_accel.cli import SKIP_STATUS

    (bench_dir / "needs_gpu_bench.py").write_text(
        f'print("skipped: needs a CUDA device")\nraise SystemExit({SKIP_STATUS})\n')
    assert main(["bench", "needs_gpu", "--path", str(bench_dir)]) == 0
    out = capfd.readouterr().out
    assert "skipped: needs a CUDA device" in out and "== needs_gpu_bench.py: skipped in" in out
    assert "1 benchmarks in" in out and "0 ok, 1 skipped, 0 failed" in out
