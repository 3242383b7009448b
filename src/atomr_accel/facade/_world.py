"""Starting a communicator world for ``System.nccl_world``."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from atomr_accel.actor import ActorError, Props
from atomr_accel.core._errors import InvalidArgument, SystemClosed, gpu_error_of
from atomr_accel.device._world import NcclWorldActor, WorldState
from atomr_accel.facade._collective import Collective
from atomr_accel.facade._device import Device

if TYPE_CHECKING:
    from atomr_accel.facade._system import System

__all__ = ["START_SECONDS", "start_world"]

START_SECONDS = 120.0
"""How long ``nccl_world`` waits at least for the first communicators."""


def _members(system: System, devices: Iterable[Device]) -> tuple[Device, ...]:
    if isinstance(devices, Device) or not isinstance(devices, Iterable):
        raise InvalidArgument("devices must be a list of Devices")
    members = tuple(devices)
    if not members:
        raise InvalidArgument("a world needs at least one device")
    for i, device in enumerate(members):
        if not isinstance(device, Device):
            raise InvalidArgument(f"devices[{i}] must be a Device, got {type(device).__name__}")
        if not any(d is device for d in system.devices):
            raise InvalidArgument(f"devices[{i}] is not a device of this system: {device!r}")
        if any(d is device for d in members[:i]):
            raise InvalidArgument(f"devices[{i}] appears twice: {device!r}")
        if "nccl" not in device.config.libraries:
            raise InvalidArgument(f"devices[{i}] was spawned without the nccl library")
    backends = {d.backend for d in members}
    if len(backends) > 1:
        raise InvalidArgument(f"a world's devices share one backend, got {sorted(backends)}")
    caps = members[0].config.capabilities
    if caps.needs_gpu:
        ids = [d.device_id for d in members]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"NCCL needs one rank per GPU, got device ids {ids}")
    nodes = {d.config.node for d in members if d.config.node is not None}
    if not caps.collectives_across_machines and len(nodes) > 1:
        raise InvalidArgument(f"the ranks of a {members[0].backend} world share one machine; "
                              f"these devices are pinned to {len(nodes)} Ray nodes")
    return members


async def start_world(system: System, devices: Iterable[Device], name: str | None = None,
                      timeout_secs: float | None = None) -> Collective:
    """Check ``devices``, spawn the world's actor and wait for its first epoch."""
    if system.closed:
        raise SystemClosed(system.actors.name, "nccl_world")
    members = _members(system, devices)
    if name is None:
        name = f"nccl-world-{next(system._names)}"
    elif not isinstance(name, str) or not name or "/" in name:
        raise InvalidArgument(f"name must be a non-empty str without '/', got {name!r}")
    wait = START_SECONDS if system._op_timeout is None else max(system._op_timeout,
                                                                START_SECONDS)
    if timeout_secs is not None:
        if isinstance(timeout_secs, bool) or not isinstance(timeout_secs, int | float) \
                or timeout_secs <= 0:
            raise InvalidArgument(f"timeout_secs must be > 0 seconds, got {timeout_secs!r}")
        wait = float(timeout_secs)
    state = WorldState(name, members[0].backend, tuple(d._state for d in members),
                       tuple(d.ref for d in members))
    portal = system._portal

    async def start() -> Collective:
        ref = system.actors.spawn(Props(NcclWorldActor, state), name)
        return Collective(ref, state, members, portal, system._op_timeout, system.actors.name)

    try:
        world = await portal.acall(start())
    except ActorError as exc:  # the system closed meanwhile, or the name is taken
        raise gpu_error_of(exc, system.actors.name, "nccl_world") from exc
    try:
        await portal.acall(world._run.ready(time.perf_counter() + wait))
    except BaseException:
        await portal.acall(_stop(system, world))
        raise
    system.worlds.append(world)
    if system.telemetry is not None:
        system.telemetry.watch_world(state)
    return world


async def _stop(system: System, world: Collective) -> None:
    system.actors.stop(world.ref)
