"""``atomr-accel probe`` (the CUDA stack), ``test`` (the package's suites) and ``bench``
(progress and one JSON report), run in-process on small stand-in folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atomr_accel.backends import cuda_device_count
from atomr_accel.cli import find_benchmarks, find_tests, main

STACK = ["libcudnn", "cuda.cccl", "cuda.bindings", "nccl", "cupti", "libcupti", "onnxruntime",
         "ray"]


def test_probe_reports_the_cuda_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    libraries = {lib["name"]: lib for lib in report["libraries"]}
    assert set(STACK) <= set(libraries)
    for lib in libraries.values():
        assert (lib["version"] is None) or lib["found"]
    cuda = report["backends"]["cuda"]
    if cuda["available"]:
        assert cuda["driver_version"] == f"{cuda['driver'] // 1000}.{cuda['driver'] % 1000 // 10}"
        assert "runtime_version" in cuda and "driver_release" in cuda
    assert main(["probe"]) == 0
    text = capsys.readouterr().out
    for name in STACK:
        row = next(line for line in text.splitlines() if line.startswith(f"  {name} "))
        want = libraries[name]["version"] or ("-" if libraries[name]["found"] else "missing")
        assert row.split()[-1] == want


@pytest.fixture
def tests_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "conftest.py").write_text(
        "def pytest_configure(config):\n"
        '    config.addinivalue_line("markers", "gpu: needs a GPU")\n')
    (folder / "test_alpha.py").write_text(
        "import pytest\n"
        "def test_cpu():\n    assert sum(range(10)) == 45\n"
        "@pytest.mark.gpu\ndef test_gpu():\n    assert True\n"
        "def test_other():\n    assert 'b' in 'abc'\n")
    (folder / "test_beta.py").write_text("def test_fails():\n    assert 1 + 1 == 3\n")
    return folder


def test_test_runs_the_chosen_suites_and_returns_pytests_status(
        tests_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert find_tests(tests_dir) == tests_dir.resolve()
    assert main(["test", "alpha", "--path", str(tests_dir)]) == 0
    out = capfd.readouterr().out
    assert "2 passed, 1 deselected" in out and "CPU tests" in out
    assert main(["test", "--gpu", "alpha", "--path", str(tests_dir)]) == 0
    assert "1 passed, 2 deselected" in capfd.readouterr().out
    assert main(["test", "--path", str(tests_dir), "-k", "fails"]) == 1  # pytest's status
    assert "1 failed" in capfd.readouterr().out
    assert main(["test", "nothing-matches", "--path", str(tests_dir)]) == 4
    assert "no suite" in capfd.readouterr().out
    assert main(["test", "--path", str(tests_dir / "missing")]) == 4


def test_test_smoke_runs_the_suite_shipped_in_the_package(
        capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["test", "--smoke", "-x"]) == 0
    out = capfd.readouterr().out
    assert "smoke suite shipped in the package (as asked)" in out
    assert "3 passed, 1 deselected" in out


def test_test_finds_the_checkout_suites() -> None:
    folder = find_tests()
    assert folder is not None and (folder / "test_cli_ops.py").is_file()


@pytest.fixture
def bench_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "benchmarks"
    folder.mkdir()
    (folder / "a_bench.py").write_text(
        "import argparse, json\n"
        "parser = argparse.ArgumentParser()\n"
        'parser.add_argument("--quick", action="store_true")\n'
        'parser.add_argument("--json")\n'
        "args = parser.parse_args()\n"
        'print("name  p50_us\\n----  ------\\nsend  12.5")\n'
        "if args.json:\n"
        '    open(args.json, "w").write(json.dumps({"p50_us": 12.5, "quick": args.quick}))\n')
    (folder / "b_bench.py").write_text('print("table of b")\n')
    (folder / "c_bench.py").write_text('print("half a table")\nraise SystemExit(3)\n')
    (folder / "gpu_d.py").write_text('print("gpu ran")\n')
    return folder


def test_bench_shows_progress_and_writes_one_json_report(
        bench_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    report_path = tmp_path / "out" / "bench.json"
    code = main(["bench", "--quick", "--path", str(bench_dir), "--json", str(report_path)])
    assert code == 1  # c_bench failed
    out = capfd.readouterr().out
    for index, name in enumerate(["a_bench.py", "b_bench.py", "c_bench.py"], 1):
        assert f"== {name}" in out and f"[{index}/4, " in out
    assert "== a_bench.py: ok in" in out and "c_bench.py exited with status 3" in out
    assert "4 benchmarks in" in out and f"wrote {report_path}" in out
    report = json.loads(report_path.read_text())
    rows = {row["name"]: row for row in report["benchmarks"]}
    assert list(rows) == ["a_bench.py", "b_bench.py", "c_bench.py", "gpu_d.py"]
    assert rows["a_bench.py"]["report"] == {"p50_us": 12.5, "quick": True}
    assert "send  12.5" in rows["a_bench.py"]["output"] and rows["a_bench.py"]["status"] == "ok"
    assert rows["b_bench.py"]["output"] == "table of b\n" and rows["b_bench.py"]["report"] is None
    assert (rows["c_bench.py"]["status"], rows["c_bench.py"]["exit_code"]) == ("failed", 3)
    assert rows["c_bench.py"]["output"] == "half a table\n"
    if cuda_device_count() == 0:
        assert rows["gpu_d.py"]["status"] == "skipped"
    assert report["quick"] is True and report["seconds"] >= 0 and "cuda" in report


def test_test_and_bench_never_run_the_current_directorys_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    # A directory someone else controls, with a tests/ and a benchmarks/ that would leave a
    # marker if they ran: from there the CLI still runs only the package's own suites.
    marker = tmp_path / "PLANTED_CODE_RAN"
    plant = f"open({str(marker)!r}, 'w').write('ran')\n"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x_planted.py").write_text(plant + "def test_ok():\n    pass\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "x_planted_bench.py").write_text(plant)
    monkeypatch.chdir(tmp_path)
    own_tests, own_benchmarks = find_tests(), find_benchmarks()
    assert own_tests is not None and (own_tests / "test_cli_ops.py").is_file()
    assert own_benchmarks is not None and (own_benchmarks / "device_bench.py").is_file()
    assert main(["test", "x_planted"]) == 4
    assert f"no suite in {own_tests} matches x_planted" in capfd.readouterr().out
    assert main(["bench", "x_planted"]) == 2
    assert f"no benchmark in {own_benchmarks} matches x_planted" in capfd.readouterr().out
    assert not marker.exists()
    assert main(["test", "x_planted", "--path", "tests"]) == 0  # named: it runs
    assert marker.exists()
