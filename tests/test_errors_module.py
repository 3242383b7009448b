"""``atomr_accel.errors`` holds the whole error tree and draws it, so neither can go stale."""

from __future__ import annotations

import importlib
import pickle
import re

import pytest

import atomr_accel
from atomr_accel import errors
from atomr_accel.agents import LeaseTimeout, UnknownVectorId

BLUEPRINTS = ("agents", "patterns", "realtime", "streams", "telemetry", "train")
ROOTS = (errors.GpuRuntimeError, errors.PatternError)


def _subclasses(root: type) -> set[type]:
    found, pending = set(), [root]
    while pending:
        cls = pending.pop()
        found.add(cls)
        pending.extend(cls.__subclasses__())
    return found


def _reachable_errors() -> set[type]:
    """Every error class of the package's trees once the package and its public
    subpackages are imported."""
    for name in BLUEPRINTS:
        importlib.import_module(f"atomr_accel.{name}")
    return {cls for root in ROOTS for cls in _subclasses(root)
            if cls.__module__.startswith("atomr_accel")}


def _drawn_tree() -> dict[str, str | None]:
    """Each class the docstring draws, with the class it is drawn under (None: a root)."""
    doc = errors.__doc__ or ""
    block = doc.split("Hierarchy::", 1)[1].split("\n\n\n")[0]
    drawn: dict[str, str | None] = {}
    stack: list[str] = []
    for line in block.splitlines():
        found = re.match(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+)\b", line)
        if not found or (not found.group(1) and "──" not in line and "(Exception)" not in line):
            continue
        depth = len(found.group(1)) // 4 + ("──" in line)
        del stack[depth:]
        drawn[found.group(2)] = stack[-1] if stack else None
        stack.append(found.group(2))
    return drawn


def test_every_error_class_is_exported_and_drawn() -> None:
    reachable = _reachable_errors()
    exported = set(errors.__all__)
    drawn = _drawn_tree()
    for cls in reachable:
        assert cls.__name__ in exported, f"{cls.__name__} is missing from errors.__all__"
        assert getattr(errors, cls.__name__) is cls
        assert cls.__name__ in drawn, f"{cls.__name__} is missing from the drawn tree"
    assert set(drawn) == exported


def test_the_drawn_tree_is_the_real_one() -> None:
    for name, parent in _drawn_tree().items():
        cls = getattr(errors, name)
        if parent is None:
            assert cls.__bases__ == (Exception,)
        else:
            assert getattr(errors, parent) in cls.__bases__, f"{name} is not a {parent}"


def test_errors_report_their_public_home_and_the_package_exports_the_same_objects() -> None:
    for name in errors.__all__:
        assert getattr(errors, name).__module__ == "atomr_accel.errors"
    for name in atomr_accel.__all__:
        if name in errors.__all__:
            assert getattr(atomr_accel, name) is getattr(errors, name)
    assert atomr_accel.actor.ActorStopped.__module__ == "atomr_accel.actor"


@pytest.mark.parametrize("error", [
    errors.OutOfMemory("no room", requested=64, available=32),
    errors.WorkerLost("worker 3 died"),
    errors.GpuRefStale("buffer", 1, 2),
    errors.KernelCompileError(6, "line 1: error", "k"),
    errors.LibraryUnavailable("cutlass", "nvidia-cutlass", "cutlass"),
    errors.FunctionFailed("f", "ValueError", "bad", "Traceback ..."),
    errors.QueueFull(0, 8),
    errors.DTypeMismatch("wanted f32"),
    errors.PortInUse("127.0.0.1", 80),
    errors.SystemClosed("app", "device call"),
    errors.AskTimeout("/user/device-0", 1.5),
    errors.HashMapFull("table full"),
    errors.CollectiveAborted("a peer died"),
    LeaseTimeout("lease"),
    UnknownVectorId("no such id"),
], ids=lambda e: type(e).__name__)
def test_errors_of_each_kind_pickle_by_their_public_name(error: Exception) -> None:
    data = pickle.dumps(error)
    assert b"atomr_accel.errors" in data
    copy = pickle.loads(data)
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)
    assert isinstance(copy, errors.GpuRuntimeError)


@pytest.mark.parametrize("error", [
    errors.QueueOverflow("full", capacity=3, policy="reject"),
    errors.RequestRejected("batcher", 3),
    errors.RequestDropped("batcher", 3),
    errors.BatchResultMismatch(4, 3),
    errors.UnknownTenant("a", ("b", "c")),
    errors.InvalidModelOutput("not a sequence"),
], ids=lambda e: type(e).__name__)
def test_the_serving_blueprints_errors_pickle_with_their_fields(error: Exception) -> None:
    """They cross processes (a Ray actor's answer, a worker's report) as any error does."""
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
    assert vars(copy) == vars(error)
    assert isinstance(copy, errors.PatternError)


def test_nvcc_error_loads_on_first_use_under_its_public_name() -> None:
    cls = errors.NvccError
    assert cls.__module__ == "atomr_accel.errors" and issubclass(cls, errors.KernelCompileError)
    error = cls(1, "nvcc: error", "gemm")
    assert type(pickle.loads(pickle.dumps(error))) is cls
