"""A worker's reply with large array buffers: written beside its pickle in a file the
parent maps (no copy) and removes at once; pickled whole where no file can be written;
a reply dropped unread leaves no file."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator

import numpy as np
import pytest

from atomr_accel.hosts import _reply_buffers
from atomr_accel.hosts._reply_buffers import discard, dumps, loads
from atomr_accel.hosts._shm import SEGMENT_PREFIX, remove_segment_files, shm_dir


def _mine() -> list[str]:
    return [n for n in os.listdir(shm_dir()) if n.startswith(f"{SEGMENT_PREFIX}{os.getpid()}-")]


@pytest.fixture(autouse=True)
def _no_files_left() -> Iterator[None]:
    """Whatever a failing test left is removed (this process writes the files here)."""
    yield
    remove_segment_files(os.getpid())


def _reply(rng: np.random.Generator) -> tuple[bool, dict[str, object]]:
    return True, {"a": rng.standard_normal((300, 70)),
                  "b": np.asfortranarray(rng.standard_normal((200, 90)).astype(np.float32)),
                  "small": rng.standard_normal(10), "text": "ok"}


def test_large_buffers_come_back_as_writable_views_of_a_removed_file() -> None:
    rng = np.random.default_rng(91)
    sent = _reply(rng)
    payload = dumps(sent)
    assert len(payload) < 4096 and len(_mine()) == 1  # the arrays are in the file
    ok, got = loads(payload)
    assert ok and _mine() == []  # mapped, then its name removed
    assert got["text"] == "ok" and got["b"].flags.f_contiguous
    for key in ("a", "b", "small"):
        np.testing.assert_array_equal(got[key], sent[1][key])
    assert not got["a"].flags.owndata  # a view of the mapping, not a copy
    got["a"][0, 0] = 7.0
    assert got["a"][0, 0] == 7.0


def test_a_reply_without_large_buffers_is_a_plain_pickle() -> None:
    value = (True, np.arange(100.0))
    payload = dumps(value)
    assert pickle.loads(payload)[1].tolist() == value[1].tolist() and _mine() == []


def test_where_no_file_can_be_written_the_reply_is_pickled_whole(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    monkeypatch.setattr(_reply_buffers, "shm_dir", lambda: os.path.join(str(tmp_path), "gone"))
    rng = np.random.default_rng(92)
    sent = _reply(rng)
    payload = dumps(sent)
    assert len(payload) > 150_000  # the arrays travel in it
    ok, got = loads(payload)
    assert ok and _mine() == []
    np.testing.assert_array_equal(got["a"], sent[1]["a"])


def test_a_reply_dropped_unread_leaves_no_file() -> None:
    payload = dumps(_reply(np.random.default_rng(93)))
    assert len(_mine()) == 1
    discard(payload)
    assert _mine() == []
    discard(dumps((True, 1)))  # nothing beside it: nothing to do
