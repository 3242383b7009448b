"""The live dashboard: a page, its ``/api/state`` JSON and an SSE stream, beside ``/metrics``."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import inspect
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any, Protocol

from atomr_accel.actor import POISON_PILL, ActorRef, ActorStopped, ActorSystem, Props
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.device import DeviceStats, GetStats
from atomr_accel.facade._portal import Portal, blocking
from atomr_accel.telemetry._events import EventLog, GetEvents, WatchDevice
from atomr_accel.telemetry._http import HttpServer, Response
from atomr_accel.telemetry._op_window import OpWindow

if TYPE_CHECKING:
    from atomr_accel.telemetry._metrics import OpMetrics

__all__ = ["STATIC_FILES", "Dashboard", "DeviceSection", "StatsSource"]

STATIC_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
                "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
                "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
"""The page's files (package data in ``atomr_accel/telemetry/static``) by the path served."""

ASK_SECONDS = 2.0
"""How long one state read waits for a device's or a panel's answer."""


class StatsSource(Protocol):
    """What a blueprint panel reads: a client whose ``stats()`` returns a dataclass
    (``DynamicBatchingServer``, ``FairShareScheduler``, ...)."""

    async def stats(self) -> Any:
        """A snapshot of the blueprint."""


DeviceSection = Callable[[str, DeviceStats], Any]
"""A per-device panel (``Dashboard.add_device_section``): called on each state read with a
device's name and its ``DeviceStats``, on the system's event loop; returns the figures to
show for it (dataclass, mapping or plain values) or None to show nothing for that device."""


class Dashboard:
    """The live view of one system's devices, libraries, supervision events and blueprints.

    Made by ``system.serve_dashboard(...)`` (``system.telemetry.dashboard``).
    It answers ``/`` (the page: static HTML, JS and CSS, no build step, no
    CDN), ``/api/state`` (``state()`` as JSON) and ``/api/events`` (the same
    state pushed as Server-Sent Events every ``push_interval`` seconds) on the
    HTTP server that serves ``/metrics``. See docs/dashboard.md.
    """

    def __init__(self, actors: ActorSystem, portal: Portal, ops: OpMetrics,
                 events: ActorRef, push_interval: float = 0.5) -> None:
        self._actors = actors
        self._portal = portal
        self._events = events
        self._window = OpWindow(ops)
        self._devices: dict[str, ActorRef] = {}
        self._last: dict[str, DeviceStats] = {}
        self._panels: dict[str, StatsSource] = {}
        self._sections: dict[str, DeviceSection] = {"functions": functions_section}
        self.push_interval = push_interval
        """Seconds between two states pushed on ``/api/events``."""

    @classmethod
    async def start(cls, actors: ActorSystem, portal: Portal, ops: OpMetrics) -> Dashboard:
        """Spawn the event log (on ``portal``'s loop) and make the dashboard."""
        async def spawn() -> ActorRef:
            return actors.spawn(Props(EventLog), "dashboard-events")

        return cls(actors, portal, ops, await portal.acall(spawn()))

    def watch(self, name: str, device: ActorRef) -> None:
        """Show the device actor ``device`` called ``name`` (one row, in the order watched)."""
        if name not in self._devices:
            self._devices[name] = device
            self._events.tell(WatchDevice(name, device))

    def add_panel(self, source: StatsSource, name: str | None = None) -> None:
        """Show a blueprint panel for ``source`` (a client with an async ``stats()``).

        ``name`` defaults to the client's ``path``. A ``DynamicBatchingServer``
        shows its queue depth and batch sizes, a ``FairShareScheduler`` each
        tenant's share; any other source shows its figures as a table. Blueprints
        spawned in the system are added by themselves (``System.adopt_blueprint``);
        a panel goes when its blueprint stops.
        """
        stats = getattr(source, "stats", None)
        if stats is None or not inspect.iscoroutinefunction(stats):
            raise InvalidArgument(f"a panel needs a client with an async stats(), got {source!r}")
        key = name if name is not None else str(getattr(source, "path", repr(source)))
        self._panels[key] = source

    def remove_panel(self, name: str) -> None:
        """Stop showing the panel called ``name`` (no error when there is none)."""
        self._panels.pop(name, None)

    def add_device_section(self, name: str, section: DeviceSection) -> None:
        """Show ``section``'s figures for each device, as ``sections[name]`` of the device's
        row in the state (the page shows them under the devices table).

        It is the place for what a device serves beyond ops (its functions, its
        residents): ``section(device_name, stats)`` is called on each state read
        and must return at once; one that raises shows ``{"error": "..."}`` for
        that device. Adding a section of the same name replaces it.
        """
        if not isinstance(name, str) or not name or not callable(section):
            raise InvalidArgument(f"a device section needs a name (str) and a callable, got "
                                  f"{name!r}, {section!r}")
        self._sections[name] = section

    def remove_device_section(self, name: str) -> None:
        """Stop showing the device section called ``name`` (no error when there is none)."""
        self._sections.pop(name, None)

    async def state_async(self) -> dict[str, Any]:
        """The dashboard's state, JSON-ready (the ``/api/state`` answer; schema in
        docs/dashboard.md): ``system``, ``time``, ``devices``, ``libraries``,
        ``events`` and ``panels``."""
        return await self._portal.acall(self._state())

    state = blocking(state_async)

    async def _state(self) -> dict[str, Any]:
        names = list(self._devices)
        answers = await asyncio.gather(
            *(self._devices[n].ask(GetStats(), timeout=ASK_SECONDS) for n in names),
            return_exceptions=True)
        devices = []
        for name, answer in zip(names, answers, strict=True):
            gone = isinstance(answer, ActorStopped)
            if isinstance(answer, DeviceStats):
                self._last[name] = answer
            stats = self._last.get(name)
            if stats is not None:
                row = _device_row(name, stats, stopped=gone)
                row["sections"] = self._device_sections(name, stats)
                devices.append(row)
        for name, source in list(self._panels.items()):
            if getattr(source, "is_alive", True) is False:  # a stopped blueprint
                del self._panels[name]
        panels = await asyncio.gather(*(self._panel(n, s) for n, s in self._panels.items()))
        try:
            events = await self._events.ask(GetEvents(), timeout=ASK_SECONDS)
        except ActorStopped:
            events = []
        return {"system": self._actors.name, "time": time.time(), "devices": devices,
                "libraries": self._window.summary(), "events": events, "panels": panels}

    def _device_sections(self, name: str, stats: DeviceStats) -> dict[str, Any]:
        sections = {}
        for key, section in list(self._sections.items()):
            try:
                value = section(name, stats)
            except Exception as exc:
                value = {"error": f"{type(exc).__name__}: {exc}"}
            if value is not None:
                sections[key] = _jsonable(value)
        return sections

    async def _panel(self, name: str, source: StatsSource) -> dict[str, Any]:
        try:
            stats = await asyncio.wait_for(source.stats(), ASK_SECONDS)
        except Exception as exc:
            return {"name": name, "kind": None, "stats": None,
                    "error": f"{type(exc).__name__}: {exc}"}
        return {"name": name, "kind": type(stats).__name__, "stats": _jsonable(stats),
                "error": None}

    def serve_on(self, server: HttpServer) -> None:
        """Add the page's routes to ``server``."""
        for path, (file, content_type) in STATIC_FILES.items():
            body = resources.files("atomr_accel.telemetry").joinpath("static", file).read_bytes()
            server.add(path, functools.partial(Response, 200, content_type, body), public=True)
        server.add("/api/state", self._state_route)
        server.add("/api/events", lambda: self._events_route(server))

    def _state_json(self) -> bytes:
        return json.dumps(self._portal.call(self._state()), allow_nan=False).encode()

    def _state_route(self) -> Response:
        return Response(200, "application/json", self._state_json())

    def _events_route(self, server: HttpServer) -> Response:
        return Response(200, "text/event-stream", stream=self._push(server))

    def _push(self, server: HttpServer) -> Iterator[bytes]:
        yield b"retry: 1000\n\n"
        while not server.closing.is_set():
            try:
                state = self._state_json()
            except Exception:  # the system closed: end the stream (the page retries)
                return
            yield b"data: " + state + b"\n\n"
            server.closing.wait(self.push_interval)

    def close(self) -> None:
        """Stop the event log (the server is closed by its owner)."""
        self._events.tell(POISON_PILL)


def functions_section(name: str, stats: DeviceStats) -> dict[str, str] | None:
    """The built-in ``"functions"`` section: a device's residents (the generation each was
    built on) and its device functions (calls, failures, latency); None for a device that
    has neither."""
    book = stats.functions
    figures: dict[str, str] = {}
    for resident in book.residents:
        built = ("not built on this context" if resident.generation is None
                 else f"built on generation {resident.generation}")
        failed = f" · last build failed: {resident.error}" if resident.error else ""
        figures[f"resident {resident.name}"] = f"{built} · {resident.builds} builds{failed}"
    for fn in book.functions:
        figures[f"function {fn.name}"] = (
            f"{fn.calls} calls · {fn.failures} failed · p50 {fn.p50_ms:.3f} ms · "
            f"p99 {fn.p99_ms:.3f} ms")
    return figures or None


def _device_row(name: str, stats: DeviceStats, *, stopped: bool) -> dict[str, Any]:
    total, free = stats.memory_total, stats.memory_free
    return {
        "name": name,
        "device_id": stats.device_id,
        "backend": stats.backend,
        "host": {"isolation": stats.isolation, "pid": stats.host_pid},
        "status": "stopped" if stopped else stats.status.value,
        "generation": stats.generation,
        "restarts": stats.restarts,
        "in_flight": stats.in_flight,
        "queue_depth": stats.queue_depth,
        "completed": stats.completed,
        "failed": stats.failed,
        "out_of_memory": stats.out_of_memory,
        "memory": {"allocated": stats.bytes_allocated, "free": free, "total": total,
                   "used": None if total is None or free is None else total - free},
        "compute_capability": list(stats.compute_capability),
        "standby_ready": stats.standby_ready,
        "reruns": stats.reruns,
    }


def _jsonable(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses and mappings become objects (keys as text),
    enums their value, non-finite floats None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)
