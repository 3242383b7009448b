"""Devices across a Ray cluster: connecting to Ray, one device per GPU or node, sharding.

``System.cluster_devices`` and ``System.shard`` are built from these. Ray is
imported lazily (``hosts._ray.ray_module``): without it, these raise
``DeviceUnavailable``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from atomr_accel.backends import BACKENDS, capabilities
from atomr_accel.core._errors import DeviceUnavailable, InvalidArgument
from atomr_accel.device._state import Status
from atomr_accel.hosts._ray import ensure_ray, ray_module

if TYPE_CHECKING:
    from atomr_accel.facade._device import Device
    from atomr_accel.facade._system import System

__all__ = [
    "connect", "disconnect", "rendezvous", "requested_backend", "resolve_backend", "spawn_cluster",
]


def connect(address: str | None) -> bool:
    """Connect to Ray at ``address`` (None: leave Ray alone); True if this call connected."""
    if address is None:
        return False
    if not isinstance(address, str) or not address:
        raise InvalidArgument(f"ray_address must be 'auto', 'local' or an address, "
                              f"got {address!r}")
    return ensure_ray(address)[1]


def disconnect() -> None:
    """Disconnect this process from Ray (``ray.shutdown``)."""
    ray_module().shutdown()


def requested_backend(mock: bool | None, backend: str) -> str:
    """``mock`` and ``backend`` checked and combined: ``mock`` decides if given (True: the
    CPU backend, False: CUDA), else ``backend`` (a backend's name or ``"auto"``)."""
    if backend != "auto" and backend not in BACKENDS:
        raise InvalidArgument(f"backend must be 'auto', 'cpu' or 'cuda', got {backend!r}")
    if mock is None:
        return backend
    wanted = "cpu" if mock else "cuda"
    if backend not in ("auto", wanted):
        raise InvalidArgument(f"mock={mock} contradicts backend={backend!r}")
    return wanted


def resolve_backend(mock: bool | None, backend: str) -> str:
    """The backend of a Ray device (see ``requested_backend``); ``"auto"`` is CUDA when the
    cluster reports a GPU (no GPU is needed on this machine)."""
    chosen = requested_backend(mock, backend)
    if chosen != "auto":
        return chosen
    ray, _ = ensure_ray()
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def _nodes(ray: Any) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


async def spawn_cluster(system: System, mock: bool | None, backend: str,
                        options: Mapping[str, Any]) -> list[Device]:
    """Spawn one Ray device per GPU (CUDA) or per node with a CPU (CPU backend), pinned to
    its node, all at once; returns them in node order."""
    for fixed in ("isolation", "node", "mock", "backend", "device_id", "name"):
        if fixed in options:
            raise InvalidArgument(f"cluster_devices chooses {fixed!r} itself")
    ray, _ = await asyncio.to_thread(ensure_ray)
    chosen = resolve_backend(mock, backend)
    wanted: list[tuple[int, str, str]] = []
    for node in _nodes(ray):
        node_id = str(node["NodeID"])
        resources = node.get("Resources", {})
        if capabilities(chosen).needs_gpu:
            wanted += [(i, node_id, f"ray-{node_id[:8]}-gpu{i}")
                       for i in range(int(resources.get("GPU", 0)))]
        elif resources.get("CPU", 0) >= 1:
            wanted.append((0, node_id, f"ray-{node_id[:8]}-cpu"))
    if not wanted:
        raise DeviceUnavailable(f"the Ray cluster reports no node for {chosen} devices")
    spawns = [system.spawn_device_async(device_id, name, backend=chosen, isolation="ray",
                                        node=node_id, **options)
              for device_id, node_id, name in wanted]
    results = await asyncio.gather(*spawns, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        for device in results:
            if not isinstance(device, BaseException):
                await system.drop_device_async(device)
        raise failed[0]
    return [r for r in results if not isinstance(r, BaseException)]


def _key_bytes(key: str | bytes | int) -> bytes:
    if isinstance(key, bytes):
        return b"b" + key
    if isinstance(key, str):
        return b"s" + key.encode()
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + str(key).encode()
    raise InvalidArgument(f"a shard key is a str, bytes or int, got {type(key).__name__}")


def _score(key: bytes, device: Device) -> int:
    digest = hashlib.blake2b(key + b"\0" + device.ref.name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rendezvous(key: str | bytes | int, devices: Sequence[Device]) -> Device:
    """The device of highest rendezvous score for ``key`` among those not stopped."""
    data = _key_bytes(key)
    alive = [d for d in devices if d._state.status is not Status.STOPPED]
    if not alive:
        raise DeviceUnavailable("no device is serving to shard keys over")
    return max(alive, key=lambda device: _score(data, device))
