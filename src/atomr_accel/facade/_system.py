"""The facade ``System``: an actor system plus the devices spawned in it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from types import TracebackType
from typing import Any, Self

from atomr_accel.actor import ActorSystem, SystemClosed
from atomr_accel.backends import cuda_device_count
from atomr_accel.core._errors import DeviceUnavailable, InvalidArgument
from atomr_accel.device import ALL_LIBRARIES, DeviceActor, DeviceConfig, DeviceState
from atomr_accel.device._config import Isolation
from atomr_accel.facade._device import Device
from atomr_accel.facade._portal import LoopThread, Portal, blocking

__all__ = ["System", "resolve_backend"]


def resolve_backend(mock: bool | None, backend: str) -> str:
    """Pick the backend: ``mock=True`` is CPU, ``mock=False`` is CUDA, else ``backend``.

    ``backend="auto"`` means CUDA when a GPU is visible, CPU otherwise. Asking
    for CUDA without a GPU raises ``DeviceUnavailable``.
    """
    if backend not in ("auto", "cpu", "cuda"):
        raise InvalidArgument(f"backend must be 'auto', 'cpu' or 'cuda', got {backend!r}")
    if mock is not None:
        wanted = "cpu" if mock else "cuda"
        if backend not in ("auto", wanted):
            raise InvalidArgument(f"mock={mock} contradicts backend={backend!r}")
        backend = wanted
    if backend == "auto":
        backend = "cuda" if cuda_device_count() > 0 else "cpu"
    if backend == "cuda" and cuda_device_count() == 0:
        raise DeviceUnavailable(
            "no CUDA device is visible (install atomr-accel[cuda] on a GPU machine, "
            "or use mock=True for the CPU backend)"
        )
    return backend


class System:
    """An actor system with devices. Open it with ``System.open(name)``.

    ``with System.open("app") as system:`` runs the actors on a background
    thread for blocking code; ``async with await System.open_async("app")``
    runs them on the caller's event loop. ``op_timeout`` bounds every device op
    (seconds, None for no limit).
    """

    def __init__(self, actors: ActorSystem, portal: Portal, loop_thread: LoopThread | None,
                 op_timeout: float | None) -> None:
        self.actors = actors
        self._portal = portal
        self._loop_thread = loop_thread
        self._op_timeout = op_timeout
        self._names = itertools.count(1)
        self.devices: list[Device] = []

    @classmethod
    def open(cls, name: str = "atomr-accel", *, op_timeout: float | None = 300.0) -> System:
        """Start a system on its own event-loop thread (for blocking code)."""
        loop_thread = LoopThread(name)
        portal = Portal(loop_thread.loop)
        actors = ActorSystem(name, default_ask_timeout=op_timeout)
        portal.call(actors.__aenter__())
        return cls(actors, portal, loop_thread, op_timeout)

    @classmethod
    async def open_async(
        cls, name: str = "atomr-accel", *, op_timeout: float | None = 300.0
    ) -> System:
        """Start a system on the running event loop (for asyncio code)."""
        import asyncio

        actors = ActorSystem(name, default_ask_timeout=op_timeout)
        await actors.__aenter__()
        return cls(actors, Portal(asyncio.get_running_loop()), None, op_timeout)

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun."""
        return self.actors.is_terminated

    async def spawn_device_async(
        self,
        device_id: int = 0,
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
    ) -> Device:
        """Start a device and wait until its context is up.

        ``mock=True`` uses the CPU backend (NumPy/SciPy), ``mock=False`` CUDA
        (``DeviceUnavailable`` without a GPU); otherwise ``backend`` decides
        (``"auto"``: CUDA if present). ``isolation="process"`` runs the context
        in a worker process so a poisoned context is really recovered.
        ``libraries`` limits the kernel actors (default: all). ``completion`` picks
        the CUDA completion strategy (``inline``, ``sync``, ``poll``, ``host_fn``).
        The context may be
        rebuilt ``max_restarts`` times within ``within`` seconds; past that the
        device stops and every request fails with ``Unrecoverable``.
        """
        if self.closed:
            raise SystemClosed(self.actors.name, "spawn_device")
        config = DeviceConfig(
            device_id=device_id,
            backend=resolve_backend(mock, backend),
            isolation=isolation,
            libraries=ALL_LIBRARIES if libraries is None else tuple(libraries),
            max_restarts=max_restarts,
            within=within,
            stash_capacity=stash_capacity,
            completion=completion,
            backend_options=dict(backend_options or {}),
        )
        state = DeviceState(device_id)
        name = f"device-{device_id}-{next(self._names)}"

        async def start() -> Device:
            ref = self.actors.spawn(DeviceActor.props(config, state), name)
            return Device(ref, config, state, self._portal, self._op_timeout)

        device = await self._portal.acall(start())
        try:
            await device.memory_info_async()  # waits until the context is up
        except BaseException:
            await self._portal.acall(_stop(self.actors, device))
            raise
        self.devices.append(device)
        return device

    spawn_device = blocking(spawn_device_async)

    async def close_async(self) -> None:
        """Stop every device and actor (children first); later calls raise ``SystemClosed``."""
        await self._portal.acall(self.actors.terminate())

    def close(self) -> None:
        """Stop every device and actor, then the event-loop thread; safe to call twice."""
        if self._loop_thread is None:
            self._portal.call(self.close_async())
            return
        if not self._portal.loop.is_closed():
            self._portal.call(self.close_async())
            self._loop_thread.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close_async()

    def __repr__(self) -> str:
        return f"System({self.actors.name!r}, devices={len(self.devices)})"


async def _stop(actors: ActorSystem, device: Device) -> None:
    actors.stop(device.ref)
