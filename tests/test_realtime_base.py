"""What every realtime actor shares (``atomr_accel.realtime._actor``), checked on each kind:
the device it is bound to (named at spawn and of the system, or placed by the system when
it starts and fixed from then on, restarts included), the buffers it frees when it stops,
and the restart from its initial state when the device's context is rebuilt."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from atomr_accel import (
    ContextPoisoned,
    GpuRefStale,
    GpuRuntimeError,
    InvalidArgument,
    System,
    Unrecoverable,
)
from atomr_accel.core.ops._faults import FaultKind
from atomr_accel.realtime import (
    ClothSimulationActor,
    FluidSimulationActor,
    GpuHashMapActor,
    GpuSparseStructureActor,
    ImageFilterPipeline,
    MultiPassAnalysisActor,
    ParticleSystemActor,
    SpatialIndexActor,
    VideoEffectsGraph,
)

SPAWNS: dict[str, Callable[..., Any]] = {
    "particles": ParticleSystemActor.spawn,
    "cloth": lambda system, **kw: ClothSimulationActor.spawn(system, 4, 4, **kw),
    "fluid": lambda system, **kw: FluidSimulationActor.spawn(system, 6, 5, **kw),
    "spatial": lambda system, **kw: SpatialIndexActor.spawn(system, 0.5, **kw),
    "hashmap": lambda system, **kw: GpuHashMapActor.spawn(system, 16, 2, 3, **kw),
    "sparse": lambda system, **kw: GpuSparseStructureActor.spawn(system, 5, 4, **kw),
    "image": lambda system, **kw: ImageFilterPipeline.spawn(system, 4, 3, 1, [0.5] * 9, **kw),
    "analysis": lambda system, **kw: MultiPassAnalysisActor.spawn(system, 4, 3, 1, **kw),
    "video": lambda system, **kw: VideoEffectsGraph.spawn(system, 4, 3, 1, **kw),
}


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    with System.open("realtime-base") as opened:
        opened.spawn_device(mock=True)
        yield opened


@pytest.mark.parametrize("kind", sorted(SPAWNS))
def test_every_actor_answers_its_device(system: System, kind: str) -> None:
    named = system.spawn_device(mock=True)
    actor = SPAWNS[kind](system, device=named)
    placed = SPAWNS[kind](system)
    assert actor.device() is named
    assert placed.device() in system.devices
    assert placed.device() is placed.device()
    actor.stop()
    placed.stop()


@pytest.mark.parametrize("kind", sorted(SPAWNS))
def test_spawn_refuses_a_device_of_another_system(system: System, kind: str) -> None:
    with System.open("realtime-base-other") as other:
        foreign = other.spawn_device(mock=True)
        with pytest.raises(InvalidArgument):
            SPAWNS[kind](system, device=foreign)
        with pytest.raises(InvalidArgument):
            SPAWNS[kind](system, device="cuda:0")


def _use(kind: str, actor: Any, rng: np.random.Generator) -> None:
    """Make the actor allocate its buffers."""
    if kind == "particles":
        actor.emit(rng.normal(size=(4, 3)), rng.normal(size=(4, 3)))
        actor.step(0.01)
    elif kind in ("cloth", "fluid"):
        actor.step(0.01)
    elif kind == "spatial":
        actor.insert(rng.normal(size=(6, 3)))
        assert actor.count() == 6
        actor.query_many(rng.normal(size=(2, 3)))
    elif kind == "hashmap":
        actor.insert(rng.integers(0, 256, 8).tolist(), rng.integers(0, 256, 12).tolist())
    elif kind == "sparse":
        actor.build([0, 4, 2], [1, 3, 0], rng.normal(size=3))
        actor.spmv(rng.normal(size=4))
    elif kind in ("image", "analysis"):
        frame = rng.integers(0, 256, 12).tolist()
        actor.process(frame) if kind == "image" else actor.analyze(frame)
    else:
        node = f"blend-{rng.integers(1 << 30)}"
        actor.add_blend(node, "source", "source", 0.25, 0.5)
        actor.set_output(node)
        actor.process(rng.integers(0, 256, 12).tolist())


@pytest.mark.parametrize("kind", sorted(SPAWNS))
def test_a_stopped_actor_frees_every_buffer(system: System, kind: str) -> None:
    device = system.spawn_device(mock=True)
    baseline = device.stats().bytes_allocated
    actor = SPAWNS[kind](system, device=device)
    _use(kind, actor, np.random.default_rng(3))
    assert device.stats().bytes_allocated > baseline
    actor.stop()
    deadline = time.monotonic() + 10
    while device.stats().bytes_allocated != baseline:
        assert time.monotonic() < deadline, "the buffers were not freed"
        time.sleep(0.01)


def _state(kind: str, actor: Any) -> Any:
    """What the actor holds, read through its public methods."""
    if kind == "particles":
        return actor.live_count()
    if kind == "spatial":
        return actor.count()
    if kind == "hashmap":
        return actor.stats()["size"]
    if kind == "sparse":
        return actor.stats()["nnz"]
    if kind == "video":
        try:
            return actor.order()
        except InvalidArgument:  # no output: the empty graph it started as
            return None
    if kind == "analysis":
        return actor.running().frames
    return None


def test_a_rebuilt_context_restarts_every_actor_on_its_device() -> None:
    with System.open("realtime-base-poison") as system:
        device = system.spawn_device(mock=True)
        rng = np.random.default_rng(5)
        actors = {kind: SPAWNS[kind](system) for kind in SPAWNS}  # placed on ``device``
        for kind, actor in actors.items():
            _use(kind, actor, rng)
        assert actors["hashmap"].stats()["size"] == 4
        with pytest.raises(ContextPoisoned):
            device.inject_fault(FaultKind.POISON)
        for kind, actor in actors.items():
            with pytest.raises(GpuRefStale):
                _use(kind, actor, rng)
            assert actor.device() is device, kind
            assert not _state(kind, actor), kind  # the initial state, empty
            _use(kind, actor, rng)  # and it works on the new context
        assert actors["hashmap"].insert(b"abcd", b"xyzuvw") == 2
        got, found = actors["hashmap"].lookup(b"cdab")
        assert found.tolist() == [True, True]
        assert bytes(got.reshape(-1)) == b"uvwxyz"


@pytest.mark.parametrize("kind", ["cloth", "hashmap"])
def test_a_failed_placement_is_answered_and_tried_again(kind: str) -> None:
    with System.open("realtime-base-empty") as system:
        actor = SPAWNS[kind](system)  # no device yet: placement fails as it starts
        with pytest.raises(GpuRuntimeError) as raised:
            actor.device()
        assert not isinstance(raised.value, Unrecoverable)  # the reason, not "stopped"
        device = system.spawn_device(mock=True)
        assert actor.device() is device  # the next request places it
        _use(kind, actor, np.random.default_rng(8))
        assert actor.device() is device
