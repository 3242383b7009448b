"""The documentation runs as written, and cites nothing a reader cannot open.

Rules for the ```python blocks of ``README.md`` and ``docs/**/*.md``:

* Every block runs as written on a CPU-only machine, except a block whose first
  line is a ``# needs: <what>`` comment (``# needs: cuda``, ``# needs: 2 GPUs``,
  ``# needs: ray cluster``): it is shown, not run here.
* The runnable blocks of one file run in order, in one fresh interpreter, in one
  namespace: a block may use names an earlier runnable block of the same file
  defined (never names of a ``# needs:`` block). Each file has a time limit.
* A failure names the file, the block's line and the exception.

Docs, the changelog and the code never cite what a reader of the repository
cannot see: design sections, issue numbers, documents outside the repository.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
NEEDS = re.compile(r"#\s*needs:\s*\S")
TIME_LIMIT_S = 180.0
"""Seconds for all the runnable blocks of one file (a 2-core machine under load)."""


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The ```python blocks of ``path``: (line of the block's first line, its source)."""
    blocks: list[tuple[int, str]] = []
    lines = path.read_text().splitlines()
    start: int | None = None
    for number, line in enumerate(lines, 1):
        if start is None and line.strip() == "```python":
            start = number + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines[start - 1:number - 1]) + "\n"))
            start = None
    return blocks


def runnable(source: str) -> bool:
    """Whether a block runs here: its first line is not a ``# needs:`` comment."""
    first = source.lstrip("\n").splitlines()[0] if source.strip() else ""
    return NEEDS.match(first.strip()) is None


_RUNNER = """
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for line, source in blocks:
    try:
        exec(compile(source, f"{sys.argv[1]}:{line}", "exec"), namespace)
    except BaseException:
        print(f"block at line {line} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_the_docs_have_python_blocks() -> None:
    assert len([p for p in DOCS if python_blocks(p)]) >= 10


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_blocks_run_as_written(path: Path, tmp_path: Path) -> None:
    blocks = [(line, source) for line, source in python_blocks(path) if runnable(source)]
    if not blocks:
        pytest.skip("every block needs what this machine may lack (# needs:)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, str(path.relative_to(ROOT))],
            input=json.dumps(blocks), capture_output=True, text=True, cwd=tmp_path, env=env,
            timeout=TIME_LIMIT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path.name}: its blocks ran past {TIME_LIMIT_S:.0f} s")
    assert done.returncode == 0, f"{path.name}:\n{done.stderr[-4000:]}"


def test_needs_marks_only_the_first_line() -> None:
    source = "# needs: cuda\nx = 1\n"
    assert not runnable(source) and runnable("x = 1\n# needs: cuda\n")
    assert python_blocks(ROOT / "README.md"), "the README shows a runnable example"


CITED = [
    (re.compile(r"\bDESIGN\b"), "the design brief (not in the repository)"),
    (re.compile("\u00a7"), "a section sign: a section of a document outside the repository"),
    (re.compile(r"\b[Ii]ssues?\s+#?\d+"), "an issue number"),
    (re.compile(r"#\d{1,4}\b(?!\w)(?=[\s).,;:]|$)"), "an issue number (#N)"),
    (re.compile(r"\.\./shared|\bseeds/"), "a folder outside the repository"),
    (re.compile(r"\bORIGINAL_PY_API\b"), "a document outside the repository"),
    (re.compile(r"atomr-accel\["), "the original's wheel (this one is atomr-accel-py)"),
]
CHECKED = sorted({*DOCS, ROOT / "CHANGELOG.md", *(ROOT / "src").rglob("*.py"),
                  *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "examples").glob("*.py")})


def test_nothing_cites_what_a_reader_cannot_see() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {why}: {line.strip()[:100]}"
             for path in CHECKED
             for number, line in enumerate(path.read_text().splitlines(), 1)
             for pattern, why in CITED if pattern.search(line)]
    assert not found, "\n".join(found)
