"""The skill files under skills/: front matter, and every example run on the CPU backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKILLS = sorted((ROOT / "skills").glob("*/SKILL.md"))
EXAMPLE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def front_matter(text: str) -> dict[str, str]:
    """The ``key: value`` lines between the opening and closing ``---``."""
    lines = text.splitlines()
    assert lines[0] == "---", "a skill file starts with YAML front matter"
    end = lines.index("---", 1)
    fields = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(":")
        assert sep and key.strip() == key and key, f"not a 'key: value' line: {line!r}"
        fields[key] = value.strip()
    return fields


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, subprocess.CompletedProcess[str]]:
    """Every skill's example, each run by a fresh interpreter (all at once), by skill file."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    started = {}
    for skill in SKILLS:
        code = EXAMPLE.findall(skill.read_text())[0]
        folder = tmp_path_factory.mktemp(skill.parent.name)
        started[skill] = (subprocess.Popen(
            [sys.executable, "-c", code], cwd=folder, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE), code)
    done = {}
    for skill, (process, code) in started.items():
        try:
            out, err = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        done[skill] = subprocess.CompletedProcess(code, process.returncode, out, err)
    return done


def test_there_is_a_skill_per_area() -> None:
    names = {skill.parent.name for skill in SKILLS}
    assert {"devices-and-buffers", "supervision-and-recovery", "completion-and-streams",
            "library-handles", "deep-learning-handles", "serving-blueprints",
            "agent-blueprints", "operations-telemetry"} <= names


@pytest.mark.parametrize("skill", SKILLS, ids=[s.parent.name for s in SKILLS])
def test_skill_has_front_matter_and_one_example(skill: Path) -> None:
    text = skill.read_text()
    fields = front_matter(text)
    assert fields.get("name") == skill.parent.name
    assert len(fields.get("description", "")) >= 40
    assert len(EXAMPLE.findall(text)) == 1
    assert len(text.splitlines()) <= 120, "a skill file stays short"


@pytest.mark.parametrize("skill", SKILLS, ids=[s.parent.name for s in SKILLS])
def test_skill_example_runs_on_the_cpu_backend(
        skill: Path, runs: dict[Path, subprocess.CompletedProcess[str]]) -> None:
    run = runs[skill]
    assert run.returncode == 0, f"{skill.parent.name} failed:\n{run.stdout}\n{run.stderr}"
    assert run.stdout.strip(), "the example prints what it shows"
