"""Damaged and hostile files handed to the package's loads, and no temporary directory.

A vector index or a checkpoint read from a file cut short, an empty file, a
``.npy`` where an ``.npz`` belongs, or content the matching ``insert`` refuses
raises ``InvalidArgument`` and leaves what was loaded before intact; a journal
with nowhere to put its temporary file says so.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atomr_accel import InvalidArgument, System
from atomr_accel.agents import CpuVectorIndex, GpuVectorIndex
from atomr_accel.facade import Device
from atomr_accel.train import (
    SGD,
    CrossEntropyLoss,
    DataParallelTrainer,
    Linear,
    ModelReplica,
    Sequential,
)

FORMAT = "atomr-accel-vector-index/1"
KINDS = ["CpuVectorIndex", "GpuVectorIndex"]


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("hostile-files") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Device:
    return system.spawn_device(0, mock=True)


def _index(system: System, dev: Device, kind: str,
           metric: str = "ip") -> CpuVectorIndex | GpuVectorIndex:
    if kind == "CpuVectorIndex":
        return CpuVectorIndex.spawn(system, dim=4, metric=metric)
    return GpuVectorIndex.spawn(system, dev, dim=4, metric=metric)


def _damaged(folder: Path, good: Path) -> dict[str, Path]:
    """A truncated copy of ``good``, an empty file and a ``.npy`` array, by name."""
    raw = good.read_bytes()
    npy = folder / "array.npy"
    np.save(npy, np.ones((3, 4), np.float32))
    files = {"truncated": raw[: len(raw) // 2], "empty": b"", "npy": npy.read_bytes()}
    paths = {}
    for name, data in files.items():
        paths[name] = folder / f"{name}.npz"
        paths[name].write_bytes(data)
    return paths


def _saved(path: Path, metric: str, ids: Any, vectors: Any, **override: Any) -> Path:
    entries = dict(format=np.array(FORMAT), metric=np.array(metric),
                   ids=np.asarray(ids), vectors=np.asarray(vectors))
    np.savez(path, **(entries | override))
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_index_file_is_refused_and_the_index_keeps_its_vectors(
        system: System, dev: Device, kind: str, tmp_path: Path) -> None:
    index = _index(system, dev, kind)
    index.insert_many([1, 2, 3], np.eye(4, dtype=np.float32)[:3])
    good = tmp_path / "good.npz"
    index.save(good)
    bad = _damaged(tmp_path, good)
    bad["strings"] = _saved(tmp_path / "strings.npz", "ip", [7], [["a"] * 4])
    bad["no format"] = _saved(tmp_path / "plain.npz", "ip", [7], [[1.0] * 4],
                              format=np.array("other"))
    for _ in range(3):  # more bad loads than the restart budget allows crashes
        for name, path in bad.items():
            with pytest.raises(InvalidArgument, match=r"cannot read|not a saved|must be"):
                index.load(path)
            assert index.count() == 3, name
    assert [i for i, _ in index.search([1, 0, 0, 0], 1)] == [1]
    assert index.load(good) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_an_index_file_is_held_to_the_checks_of_insert_many(
        system: System, dev: Device, kind: str, tmp_path: Path) -> None:
    index = _index(system, dev, kind)
    index.insert(1, [1, 0, 0, 0])
    refused = {
        "distinct": _saved(tmp_path / "dup.npz", "ip", [5, 5, 6], np.eye(4)[:3]),
        "finite": _saved(tmp_path / "nan.npz", "ip", [7, 8],
                         [[np.nan, 0, 0, 0], [1, np.inf, 0, 0]]),
        "numbers": _saved(tmp_path / "dim.npz", "ip", [7], [[1.0, 2.0]]),
        "ids for": _saved(tmp_path / "count.npz", "ip", [7, 8], [[1.0] * 4]),
        "holds a cosine": _saved(tmp_path / "metric.npz", "cosine", [7], [[1.0] * 4]),
        "ints": _saved(tmp_path / "ids.npz", "ip", np.array([7.5]), [[1.0] * 4]),
    }
    for words, path in refused.items():
        with pytest.raises(InvalidArgument, match=words):
            index.load(path)
        assert index.search([1, 0, 0, 0], 5) == [(1, 1.0)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_cosine_index_file_is_normalized_as_an_insert_is(
        system: System, dev: Device, kind: str, tmp_path: Path) -> None:
    index = _index(system, dev, kind, "cosine")
    assert index.load(_saved(tmp_path / "cos.npz", "cosine", [9], [[10, 10, 10, 10]])) == 1
    [(found, score)] = index.search([1, 0, 0, 0], 1)
    assert found == 9 and score == pytest.approx(0.5)
    empty = _index(system, dev, kind, "cosine")
    empty.save(tmp_path / "empty.npz")
    assert index.load(tmp_path / "empty.npz") == 0 and index.count() == 0


def test_a_damaged_checkpoint_is_invalid_argument_and_training_goes_on(
        tmp_path: Path) -> None:
    with System.open("hostile-checkpoints", op_timeout=60) as system:
        devs = [system.spawn_device(i, mock=True) for i in range(2)]
        model = Sequential(Linear(4, 3))
        replica = ModelReplica.create(devs[0], model, loss=CrossEntropyLoss(),
                                      optimizer=SGD(0.1), seed=0)
        trainer = DataParallelTrainer.spawn(system, model, loss=CrossEntropyLoss(),
                                            optimizer=SGD(0.1), devices=devs)
        good = tmp_path / "good.npz"
        replica.save(good)
        loads: dict[str, Callable[[Path], object]] = {
            "replica": replica.load, "trainer": trainer.load}
        for load in loads.values():
            for path in _damaged(tmp_path, good).values():
                with pytest.raises(InvalidArgument, match="cannot read a saved state"):
                    load(path)
            load(good)
        x = np.ones((2, 4), np.float32)
        y = np.array([0, 1], np.int64)
        assert np.isfinite(replica.train_step(x, y))


def test_a_journal_with_no_temporary_directory_names_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with System.open("hostile-journal-temp") as system:
        monkeypatch.setattr(tempfile, "tempdir", str(missing))
        with pytest.raises(InvalidArgument, match=rf"temporary file in {missing}.*"
                                                  "FileNotFoundError"):
            system.spawn_device(mock=True, journal=True)
        assert not system.closed
        assert system.spawn_device(mock=True).generation == 1
