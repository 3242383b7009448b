"""The facade ``System``: an actor system plus the devices spawned in it."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import weakref
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from atomr_accel.actor import ActorError, ActorSystem, Props
from atomr_accel.backends import (
    backend_class,
    capabilities,
    cuda_capability,
    cuda_device_count,
)
from atomr_accel.core._errors import (
    DeviceUnavailable,
    InvalidArgument,
    SystemClosed,
    gpu_error_of,
)
from atomr_accel.device import (
    ALL_LIBRARIES,
    DeviceActor,
    DeviceConfig,
    DeviceState,
    Journal,
    JournalConfig,
    PlacementActor,
    Policy,
)
from atomr_accel.device._config import Isolation
from atomr_accel.facade import _cluster as cluster
from atomr_accel.facade import _peer as peer
from atomr_accel.facade import _world as collective
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.facade._collective import Collective
from atomr_accel.facade._device import Device
from atomr_accel.facade._placement import Placement, policy_of
from atomr_accel.facade._portal import ClosesOnExit, LoopThread, Portal, blocking

if TYPE_CHECKING:
    from atomr_accel.telemetry import Telemetry

__all__ = ["System", "check_backend_options", "resolve_backend"]


def resolve_backend(mock: bool | None, backend: str) -> str:
    """Pick the backend: ``mock=True`` is CPU, ``mock=False`` is CUDA, else ``backend``.

    ``backend="auto"`` means CUDA when a GPU is visible, CPU otherwise. Asking
    for CUDA without a GPU raises ``DeviceUnavailable``.
    """
    backend = cluster.requested_backend(mock, backend)
    if backend == "auto":
        backend = "cuda" if cuda_device_count() > 0 else "cpu"
    if capabilities(backend).needs_gpu and cuda_device_count() == 0:
        raise DeviceUnavailable(
            "no CUDA device is visible (install atomr-accel-py[cuda] on a GPU machine, "
            "or use mock=True for the CPU backend)"
        )
    return backend


def check_backend_options(backend: str, options: Mapping[str, Any]) -> None:
    """Refuse ``options`` the backend's constructor does not take (``InvalidArgument``).

    The constructor's keyword parameters are the options (``capacity`` for
    ``cpu``; ``completion`` and ``kernel_cache_dir`` for ``cuda``).
    """
    parameters = inspect.signature(backend_class(backend)).parameters
    known = [name for name in parameters if name != "device_id"]
    unknown = sorted(set(options) - set(known), key=str)
    if unknown:
        raise InvalidArgument(
            f"unknown {backend} backend option {unknown[0]!r}; choose from {', '.join(known)}")


START_SECONDS = 120.0
"""How long ``spawn_device`` waits at least for a new device's context to come up."""


class System(ClosesOnExit):
    """An actor system with devices. Open it with ``System.open(name)``.

    ``with System.open("app") as system:`` runs the actors on a background
    thread for blocking code; ``async with await System.open_async("app")``
    runs them on the caller's event loop. ``op_timeout`` bounds every device op
    (seconds, None for no limit).
    """

    def __init__(self, actors: ActorSystem, portal: Portal, loop_thread: LoopThread | None,
                 op_timeout: float | None, ray_connected: bool = False) -> None:
        self.actors = actors
        self._portal = portal
        self._loop_thread = loop_thread
        self._op_timeout = op_timeout
        self._names = itertools.count(1)
        self._ray_connected = ray_connected  # this system connected Ray: close disconnects
        self._cluster: list[Device] = []
        self.devices: list[Device] = []
        self.worlds: list[Collective] = []
        """The communicator worlds started with ``nccl_world``."""
        self._placement: Placement | None = None
        self.telemetry: Telemetry | None = None
        """The system's ``Telemetry`` once ``enable_telemetry`` was called, else None."""
        self._blueprints: weakref.WeakSet[Any] = weakref.WeakSet()

    @classmethod
    def open(cls, name: str = "atomr-accel", *, op_timeout: float | None = 300.0,
             ray_address: str | None = None) -> System:
        """Start a system on its own event-loop thread (for blocking code).

        ``ray_address`` connects this process to Ray for ``isolation="ray"``
        devices: ``"auto"`` (the cluster this machine belongs to), a cluster's
        address, or ``"local"`` to start a local Ray; None leaves Ray alone (a
        Ray device then uses the Ray this process is connected to, or starts a
        local one). A Ray this call connected is disconnected by ``close``.
        """
        connected = cluster.connect(ray_address)
        loop_thread = LoopThread(name)
        portal = Portal(loop_thread.loop)
        actors = ActorSystem(name, default_ask_timeout=op_timeout)
        portal.call(actors.__aenter__())
        return cls(actors, portal, loop_thread, op_timeout, connected)

    @classmethod
    async def open_async(
        cls, name: str = "atomr-accel", *, op_timeout: float | None = 300.0,
        ray_address: str | None = None,
    ) -> System:
        """Start a system on the running event loop (for asyncio code); ``ray_address`` as
        in ``open``."""
        import asyncio

        connected = await asyncio.to_thread(cluster.connect, ray_address)
        actors = ActorSystem(name, default_ask_timeout=op_timeout)
        await actors.__aenter__()
        return cls(actors, Portal(asyncio.get_running_loop()), None, op_timeout, connected)

    @property
    def name(self) -> str:
        """The system's name (``System.open(name)``)."""
        return self.actors.name

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun."""
        return self.actors.is_terminated

    def spawn_device_async(
        self,
        device_id: int = 0,
        name: str | None = None,
        mock: bool | None = None,
        backend: str = "auto",
        isolation: Isolation = "thread",
        libraries: Iterable[str] | None = None,
        *,
        max_restarts: int = 3,
        within: float = 60.0,
        stash_capacity: int = 1024,
        completion: str | None = None,
        backend_options: dict[str, Any] | None = None,
        journal: JournalConfig | Journal | str | os.PathLike[str] | bool | None = None,
        standby: int = 0,
        node: str | None = None,
        ray_options: Mapping[str, Any] | None = None,
    ) -> Coroutine[Any, Any, Device]:
        """Start a device and wait until its context is up (its arguments are checked when
        called, before anything starts).

        ``name`` names its actor, logs and metrics (default ``device-<id>-<n>``;
        unique within the system). ``mock=True`` uses the CPU backend (NumPy/SciPy),
        ``mock=False`` CUDA (``DeviceUnavailable`` without a GPU); otherwise ``backend`` decides
        (``"auto"``: CUDA if present). ``isolation="process"`` runs the context
        in a worker process so a poisoned context is really recovered.
        ``libraries`` limits the kernel actors (default: all). ``completion`` picks
        the CUDA completion strategy (``inline``, ``sync``, ``poll``, ``host_fn``).
        The context may be
        rebuilt ``max_restarts`` times within ``within`` seconds; past that the
        device stops and every request fails with ``Unrecoverable``.
        ``journal`` records the device's completed ops (see docs/replay.md):
        True for ``$ATOMR_ACCEL_JOURNAL`` or a temporary SQLite file, an SQLite
        path, ``":memory:"``, a ``postgresql://`` URL, a shared ``Journal`` or a
        ``JournalConfig``; it is what keeps durable buffers across rebuilds.
        ``standby=1`` (process isolation) keeps a spare worker with its context
        started, so a rebuild takes it at once instead of starting a process; it
        costs that worker's memory (and on CUDA its context on the GPU).
        ``isolation="ray"`` runs the context in a Ray actor (one GPU for CUDA,
        one CPU otherwise) on any node of the Ray cluster; ``node`` (a Ray node
        id) pins it there while that node lives, ``ray_options`` go to Ray's
        actor options (see docs/ray.md).
        """
        if self.closed:
            raise SystemClosed(self.actors.name, "spawn_device")
        if isolation == "ray":
            chosen = cluster.resolve_backend(mock, backend)
        else:
            chosen = resolve_backend(mock, backend)
        options = dict(backend_options or {})
        if isolation != "ray" or not capabilities(chosen).needs_gpu:  # a Ray node checks its own
            check_backend_options(chosen, options)
        config = DeviceConfig(
            device_id=device_id,
            backend=chosen,
            isolation=isolation,
            libraries=ALL_LIBRARIES if libraries is None else tuple(libraries),
            max_restarts=max_restarts,
            within=within,
            stash_capacity=stash_capacity,
            completion=completion,
            backend_options=options,
            journal=JournalConfig.of(journal),
            standby=standby,
            node=node,
            ray_options=dict(ray_options or {}),
        )
        if name is None:
            name = f"device-{device_id}-{next(self._names)}"
        elif not isinstance(name, str) or not name or "/" in name:
            raise InvalidArgument(f"name must be a non-empty str without '/', got {name!r}")
        elif any(d.ref.name == name for d in self.devices):
            raise InvalidArgument(f"this system already has a device named {name!r}")
        return self._spawn(config, name)

    async def _spawn(self, config: DeviceConfig, name: str) -> Device:
        state = DeviceState(config.device_id, name)

        async def start() -> Device:
            ref = self.actors.spawn(DeviceActor.props(config, state), name)
            return Device(ref, config, state, self._portal, self._op_timeout, self.actors.name)

        try:
            device = await self._portal.acall(start())
        except ActorError as exc:  # the system closed meanwhile
            raise gpu_error_of(exc, self.actors.name, "spawn_device") from exc
        if capabilities(config.backend).needs_gpu and config.isolation != "ray":
            state.capability = cuda_capability(config.device_id)
        # Wait until the context is up: a worker process and a CUDA context take seconds,
        # far longer than an op_timeout tuned for ops may allow.
        start_wait = None if self._op_timeout is None else max(self._op_timeout, START_SECONDS)
        try:
            await device.memory_info_async(timeout_secs=start_wait)
        except BaseException:
            await self._portal.acall(_stop(self.actors, device))
            raise
        self.devices.append(device)
        if self._placement is not None:
            self._placement.add(device)
        if self.telemetry is not None:
            self.telemetry.watch(device.ref, state)
        return device

    spawn_device = blocking(spawn_device_async)

    async def drop_device_async(self, device: Device) -> None:
        """Stop ``device`` for good (its context is closed) and forget it."""
        await self._portal.acall(_stop(self.actors, device))
        if self.telemetry is not None:
            self.telemetry.unwatch(device._state)
        for devices in (self.devices, self._cluster):
            if device in devices:
                devices.remove(device)

    drop_device = blocking(drop_device_async)

    async def cluster_devices_async(self, mock: bool | None = None, backend: str = "auto",
                                    **options: Any) -> list[Device]:
        """Spawn one ``isolation="ray"`` device per GPU the Ray cluster reports (CUDA), or
        one per alive node (CPU backend), each pinned to its node; returns them.

        ``mock`` and ``backend`` choose the backend as in ``spawn_device``
        (``"auto"``: CUDA when the cluster has GPUs); ``options`` go to each
        ``spawn_device`` (``libraries``, ``journal``, ``max_restarts``, ...).
        These devices are the ones ``shard`` routes keys to.
        """
        devices = await cluster.spawn_cluster(self, mock, backend, options)
        self._cluster.extend(devices)
        return devices

    cluster_devices = blocking(cluster_devices_async)

    def shard(self, key: str | bytes | int, devices: Iterable[Device] | None = None) -> Device:
        """The device ``key`` belongs to, by rendezvous hashing over ``devices`` (default:
        the ``cluster_devices``, else every device of the system) that have not stopped.

        Adding or removing one of N devices moves only the keys of that device
        (about 1/N of them); a device rebuilt on another node keeps its keys.
        Raises ``DeviceUnavailable`` when no device is left.
        """
        pool = list(devices) if devices is not None else (self._cluster or self.devices)
        return cluster.rendezvous(key, pool)

    async def placement_async(self, policy: Policy | str = "round_robin",
                              devices: Iterable[Device] | None = None) -> Placement:
        """Start a ``Placement`` over ``devices`` (default: every device spawned so far).

        ``policy``: ``"round_robin"``, ``"least_loaded"`` (fewest requests in
        flight plus queued) or ``"memory_fit"`` (most free device memory among
        those with room); ``pick()`` may override it per call.
        """
        if self.closed:
            raise SystemClosed(self.actors.name, "placement")
        chosen = list(self.devices if devices is None else devices)
        strange = [d for d in chosen if d not in self.devices]
        if strange:
            raise InvalidArgument(f"{strange[0]!r} is not a device of this system")
        how = policy_of(policy)
        name = f"placement-{next(self._names)}"

        async def start() -> Placement:
            ref = self.actors.spawn(Props(PlacementActor, [d.ref for d in chosen], how), name)
            return Placement(ref, chosen, how, self._portal, self.actors.name)

        try:
            return await self._portal.acall(start())
        except ActorError as exc:  # the system closed meanwhile
            raise gpu_error_of(exc, self.actors.name, "placement") from exc

    placement = blocking(placement_async)

    async def place_async(self, bytes_needed: int = 0,
                          policy: Policy | str = "least_loaded") -> Device:
        """Pick one of this system's devices for work needing ``bytes_needed`` bytes.

        Uses one placement over every device the system spawns (see
        ``placement``). Raises ``OutOfMemory`` when no device has
        ``bytes_needed`` free, ``DeviceUnavailable`` when none is serving.
        """
        if self._placement is None:
            self._placement = await self.placement_async(policy)
        return await self._placement.pick_async(bytes_needed, policy)

    place = blocking(place_async)

    async def enable_telemetry_async(self, port: int | None = None, *, addr: str = "127.0.0.1",
                                     interval: float | None = 1.0,
                                     allowed_hosts: Iterable[str] | str | None = None,
                                     token: str | None = None) -> Telemetry:
        """Collect Prometheus metrics of every device (now and later); serve them on ``port``.

        ``port=0`` picks a free port (``telemetry.port`` says which); None
        serves nothing (``telemetry.render()`` still works). The server also
        answers ``/healthz`` and ``/readyz``; ``allowed_hosts`` and ``token``
        say whom it answers (``Telemetry.serve``, docs/dashboard.md). Device
        gauges are sampled every ``interval`` seconds. Calling it again returns
        the same ``Telemetry`` (serving it if it was not). Raises
        ``InvalidArgument`` for a malformed port or option and ``PortInUse``
        for a port another server has. Needs ``prometheus-client``.
        """
        if self.closed:
            raise SystemClosed(self.actors.name, "enable_telemetry")
        if self.telemetry is None:
            from atomr_accel.telemetry import Telemetry

            self.telemetry = await Telemetry.start(self.actors, self._portal, interval)
            for device in self.devices:
                self.telemetry.watch(device.ref, device._state)
            for world in self.worlds:
                self.telemetry.watch_world(world._state)
        if port is not None and self.telemetry.port is None:
            self.telemetry.serve(port, addr, allowed_hosts=allowed_hosts, token=token)
        return self.telemetry

    enable_telemetry = blocking(enable_telemetry_async)

    async def serve_dashboard_async(self, port: int = 0, addr: str = "127.0.0.1", *,
                                    allowed_hosts: Iterable[str] | str | None = None,
                                    token: str | None = None) -> int:
        """Serve the live dashboard page of this system; return the port it is on.

        Enables telemetry (as ``enable_telemetry``) and serves, from the same
        HTTP server as ``/metrics``: ``/`` (one row per device, op rates and
        latency percentiles per library, recent supervision events, a panel per
        blueprint with an async ``stats()``),
        ``/api/state`` (JSON) and ``/api/events`` (Server-Sent Events). When
        ``/metrics`` is served already the dashboard joins that port. Only
        requests whose ``Host`` is an IP address, ``localhost`` or one of
        ``allowed_hosts`` are answered; with ``token`` they need it too (see
        docs/dashboard.md). Raises ``InvalidArgument`` for a malformed port or
        option and ``PortInUse`` for a port another server has. Needs
        ``prometheus-client``.
        """
        telemetry = await self.enable_telemetry_async()
        served = await telemetry.serve_dashboard_async(port, addr, allowed_hosts=allowed_hosts,
                                                       token=token)
        for client in list(self._blueprints):
            self._show(client)
        return served

    serve_dashboard = blocking(serve_dashboard_async)

    def adopt_blueprint(self, client: Any) -> None:
        """Remember a blueprint client spawned in this system (its ``spawn`` calls this): one
        with an async ``stats()`` shows as a dashboard panel while it runs, whether the
        dashboard is served before or after it starts."""
        self._blueprints.add(client)
        self._show(client)

    def _show(self, client: Any) -> None:
        dashboard = None if self.telemetry is None else self.telemetry.dashboard
        if dashboard is not None and inspect.iscoroutinefunction(getattr(client, "stats", None)):
            dashboard.add_panel(client)

    async def can_access_async(self, a: Device, b: Device) -> bool:
        """True when device ``a`` can read and write ``b``'s memory directly (CUDA peer access).

        A device reaches its own memory; CPU devices and mixed pairs never
        reach each other's (their copies go through the host).
        """
        return await peer.can_access(self, a, b)

    can_access = blocking(can_access_async)

    async def peer_topology_async(self) -> peer.PeerTopology:
        """Which of this system's CUDA devices reach each other's memory (``PeerTopology``)."""
        return await peer.peer_topology(self)

    peer_topology = blocking(peer_topology_async)

    async def enable_peer_access_async(self) -> peer.PeerTopology:
        """Enable peer access between every pair of this system's CUDA devices that can have it.

        Each device enables it in its own context (its worker process on the
        process host); calling it again is harmless. Returns the pairs now
        enabled (empty without CUDA devices).
        """
        return await peer.enable_peer_access(self)

    enable_peer_access = blocking(enable_peer_access_async)

    async def copy_between_async(
        self, src: GpuBuffer, dst: GpuBuffer, length: int | None = None,
        src_offset: int = 0, dst_offset: int = 0,
    ) -> peer.CopyPath:
        """Copy ``length`` elements from ``src[src_offset:]`` into ``dst[dst_offset:]``.

        ``src`` and ``dst`` are buffers of one dtype on two different devices of
        this system; ``length`` defaults to as many as fit in both. The copy is
        ordered after earlier writes to ``src`` and around other work on
        ``dst``, and this returns once it has finished, with the ``CopyPath`` it
        took: ``peer`` (both contexts in this process), ``ipc`` (CUDA IPC
        between worker processes) or ``staged`` (through the host: CPU devices,
        mixed backends, no peer access, a journaled destination). Raises
        ``InvalidArgument`` (same device: use ``Device.copy``), ``GpuRefStale``
        or ``SystemClosed``.
        """
        return await peer.copy_between(self, src, dst, length, src_offset, dst_offset)

    copy_between = blocking(copy_between_async)

    async def nccl_world_async(self, devices: Iterable[Device], name: str | None = None, *,
                               timeout_secs: float | None = None) -> Collective:
        """Start a communicator world over ``devices`` (rank i = the i-th) and wait until it
        serves; returns its ``Collective``.

        The devices must be distinct devices of this system, of one backend,
        with the ``nccl`` library enabled: CUDA devices run NCCL, CPU devices
        the same collectives through the host (see docs/collectives.md). The
        world is an ``NcclWorldActor`` that rebuilds its communicators whenever
        a member's context is rebuilt. ``timeout_secs`` bounds the wait for
        the first communicators (default: the system's ``op_timeout``, at least
        120 s); past it the world is stopped and ``CollectiveAborted`` raised.
        """
        return await collective.start_world(self, devices, name, timeout_secs)

    nccl_world = blocking(nccl_world_async)

    async def close_async(self) -> None:
        """Stop every device and actor (children first); calls still waiting and later
        calls raise ``SystemClosed``."""
        if self.telemetry is not None:
            await self.telemetry.close_async()
        try:
            await self._portal.acall(self.actors.terminate())
        finally:
            self._portal.close()
            if self._ray_connected:
                self._ray_connected = False
                cluster.disconnect()

    def close(self) -> None:
        """Stop every device and actor, then the event-loop thread; safe to call twice."""
        if self._loop_thread is None:
            self._portal.call(self.close_async())
            return
        if not self._portal.loop.is_closed():
            with contextlib.suppress(SystemClosed):  # closed already (by close_async)
                self._portal.call(self.close_async())
            self._portal.close()
            self._loop_thread.stop()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close_async()

    def __repr__(self) -> str:
        return f"System(name={self.actors.name!r}, devices={len(self.devices)})"


async def _stop(actors: ActorSystem, device: Device) -> None:
    actors.stop(device.ref)
