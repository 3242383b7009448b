"""Telemetry: a system's Prometheus registry, fed by its devices and NVML, served over HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atomr_accel.actor import (
    POISON_PILL,
    Actor,
    ActorRef,
    ActorStopped,
    ActorSystem,
    Props,
)
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.device import DeviceState, DeviceStats, GetStats
from atomr_accel.device._world import WorldState
from atomr_accel.facade._portal import Portal, blocking
from atomr_accel.telemetry._access import Access
from atomr_accel.telemetry._dashboard import Dashboard
from atomr_accel.telemetry._health import health, ready_response
from atomr_accel.telemetry._http import MAX_CONNECTIONS, READ_TIMEOUT, HttpServer, Response
from atomr_accel.telemetry._metrics import DeviceCollector, OpMetrics, WorldCollector
from atomr_accel.telemetry._nvml import NvmlProbe, NvmlSample

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["Telemetry"]


@dataclass(frozen=True, slots=True)
class _Watch:
    name: str
    device: ActorRef


@dataclass(frozen=True, slots=True)
class _Sample:
    pass


class _Sampler(Actor):
    """Asks every watched device for its stats, on a timer and on demand."""

    def __init__(self, collector: DeviceCollector, interval: float | None) -> None:
        self.collector = collector
        self.devices: dict[str, ActorRef] = {}
        if interval is not None:
            self.context.schedule_repeatedly(interval, _Sample(), key="sample")

    async def receive(self, message: Any) -> None:
        if isinstance(message, _Watch):
            self.devices[message.name] = message.device
        elif isinstance(message, _Sample):
            names = list(self.devices)
            results = await asyncio.gather(
                *(self.devices[n].ask(GetStats(), timeout=5.0) for n in names),
                return_exceptions=True)
            for name, result in zip(names, results, strict=True):
                if isinstance(result, DeviceStats):
                    self.collector.update(name, result)
                elif isinstance(result, ActorStopped):
                    del self.devices[name]  # the device is gone; keep its last figures
        else:
            raise TypeError(f"the telemetry sampler does not handle {message!r}")


class Telemetry:
    """Prometheus metrics of one system's devices, on a registry of its own.

    Made by ``system.enable_telemetry(...)``. Op counters, in-flight gauges and
    latency histograms per device and library are updated as ops finish (an
    ``OpObserver`` on each device); device gauges (generation, restarts, queue
    depth, bytes allocated, device memory) come from ``DeviceStats`` sampled
    every ``interval`` seconds and by ``refresh``; GPU gauges from an
    ``NvmlProbe`` started by ``start_nvml``. ``render()`` returns the text
    exposition; ``serve(port)`` serves it at ``/metrics`` (with ``/healthz`` and
    ``/readyz`` for orchestrators), and ``serve_dashboard`` adds the live
    dashboard page to that server. Needs
    ``prometheus-client`` (the ``telemetry`` extra).
    """

    def __init__(self, actors: ActorSystem, portal: Portal, sampler: ActorRef,
                 collector: DeviceCollector, ops: OpMetrics, registry: CollectorRegistry,
                 worlds: WorldCollector | None = None) -> None:
        self.registry = registry
        """The ``prometheus_client.CollectorRegistry`` holding every metric of this system."""
        self._ops = ops
        self._actors = actors
        self._portal = portal
        self._sampler = sampler
        self._collector = collector
        self._states: list[DeviceState] = []
        self._devices: dict[str, ActorRef] = {}
        self._server: HttpServer | None = None
        self.dashboard: Dashboard | None = None
        """The live dashboard once ``serve_dashboard`` was called, else None."""
        self._lock = threading.Lock()
        self._gpu: dict[str, Any] = {}
        self._worlds = worlds or WorldCollector()

    @classmethod
    async def start(cls, actors: ActorSystem, portal: Portal, interval: float | None = 1.0
                    ) -> Telemetry:
        """Create the registry and spawn the stats sampler (on ``portal``'s loop)."""
        try:
            from prometheus_client import CollectorRegistry
        except ImportError as exc:
            raise ImportError("telemetry needs prometheus-client: "
                              "pip install 'atomr-accel-py[telemetry]'") from exc
        if interval is not None and interval <= 0:
            raise InvalidArgument(f"interval must be > 0 (or None), got {interval!r}")
        registry = CollectorRegistry()
        ops = OpMetrics(registry)
        collector = DeviceCollector()
        registry.register(collector)
        worlds = WorldCollector()
        registry.register(worlds)

        async def spawn() -> ActorRef:
            return actors.spawn(Props(_Sampler, collector, interval), "telemetry")

        sampler = await portal.acall(spawn())
        return cls(actors, portal, sampler, collector, ops, registry, worlds)

    def watch(self, device: ActorRef, state: DeviceState) -> None:
        """Collect the metrics of the device at ``device`` whose state is ``state``."""
        if state not in self._states:
            self._states.append(state)
            state.add_observer(self._ops)
            self._sampler.tell(_Watch(state.name, device))
            self._devices[state.name] = device
            if self.dashboard is not None:
                self.dashboard.watch(state.name, device)

    def watch_world(self, world: WorldState) -> None:
        """Collect the metrics of a communicator world (``System.nccl_world``)."""
        self._worlds.add(world)

    async def refresh_async(self) -> None:
        """Sample every watched device's stats now and wait until the gauges hold them."""
        await self._portal.acall(self._sampler.ask(_Sample()))

    refresh = blocking(refresh_async)

    def render(self) -> str:
        """The metrics in Prometheus' text exposition format (as served at ``/metrics``)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()

    def serve(self, port: int = 0, addr: str = "127.0.0.1", *,
              allowed_hosts: Iterable[str] | str | None = None, token: str | None = None,
              max_connections: int = MAX_CONNECTIONS, read_timeout: float = READ_TIMEOUT) -> int:
        """Serve ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP on ``addr:port`` (0: a
        free port); return the port.

        Runs on a daemon thread until ``close``. Requests whose ``Host`` is not an
        IP address, ``localhost`` or one of ``allowed_hosts`` get 403; with
        ``token``, every path but ``/healthz`` and the dashboard's static files needs
        ``Authorization: Bearer <token>`` (or ``?token=``), else 401. At most
        ``max_connections`` are served at once; a request must arrive within
        ``read_timeout`` seconds. Raises ``InvalidArgument`` for a malformed option
        or an address it cannot listen on, ``PortInUse`` when the port is taken,
        and ``InvalidArgument`` when already served.
        """
        access = Access.of(allowed_hosts, token)
        with self._lock:
            if self._server is not None:
                raise InvalidArgument(f"telemetry is already served on port {self.port}")
            server = HttpServer(port, addr, access, max_connections=max_connections,
                                read_timeout=read_timeout)
            server.add("/metrics", self._metrics_route)
            server.add("/healthz", health, public=True)
            server.add("/readyz", lambda: ready_response(list(self._states)))
            if self.dashboard is not None:
                self.dashboard.serve_on(server)
            self._server = server
            return server.port

    def _metrics_route(self) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(200, CONTENT_TYPE_LATEST, self.render().encode())

    @property
    def port(self) -> int | None:
        """The HTTP port ``/metrics`` is served on, or None."""
        server = self._server
        return None if server is None else server.port

    async def serve_dashboard_async(self, port: int = 0, addr: str = "127.0.0.1", *,
                                    allowed_hosts: Iterable[str] | str | None = None,
                                    token: str | None = None) -> int:
        """Serve the live dashboard (``/``, ``/api/state``, ``/api/events``) beside
        ``/metrics``; return the port.

        Uses the server ``/metrics`` is on when there is one (``port`` must then
        be 0 or that port, and ``allowed_hosts`` and ``token`` None or the ones it
        serves with, else ``InvalidArgument``); otherwise starts one on
        ``addr:port`` (0: a free port) as ``serve`` does. Calling it again returns
        the same port.
        """
        access = Access.of(allowed_hosts, token)
        if self.dashboard is None:
            dashboard = await Dashboard.start(self._actors, self._portal, self._ops)
            if self.dashboard is not None:  # another call made one meanwhile
                dashboard.close()
            else:
                for name, device in self._devices.items():
                    dashboard.watch(name, device)
                self.dashboard = dashboard
                if self._server is not None:
                    dashboard.serve_on(self._server)
        server = self._server
        if server is None:
            return self.serve(port, addr, allowed_hosts=allowed_hosts, token=token)
        if port not in (0, server.port):
            raise InvalidArgument(
                f"telemetry is already served on port {server.port}, not {port}")
        if (allowed_hosts is not None or token is not None) and access != server.access:
            raise InvalidArgument(f"telemetry is already served on port {server.port} with "
                                  "other allowed_hosts or token")
        return server.port

    serve_dashboard = blocking(serve_dashboard_async)

    async def start_nvml_async(self, index: int = 0, interval: float | None = 5.0) -> ActorRef:
        """Start an ``NvmlProbe`` for GPU ``index`` that feeds the ``atomr_gpu_*`` gauges.

        Returns the probe; ask it ``GetSample()`` for a reading (it answers
        ``DeviceUnavailable`` where NVML is missing).
        """
        async def spawn() -> ActorRef:
            props = Props(NvmlProbe, index, interval, self._on_gpu_sample)
            return self._actors.spawn(props, f"nvml-{index}")

        return await self._portal.acall(spawn())

    start_nvml = blocking(start_nvml_async)

    def _on_gpu_sample(self, sample: NvmlSample) -> None:
        from prometheus_client import Gauge

        if not self._gpu:
            labels = ["gpu", "name"]
            self._gpu = {
                "power_watts": Gauge("atomr_gpu_power_watts", "Board power draw.", labels,
                                     registry=self.registry),
                "temperature_c": Gauge("atomr_gpu_temperature_celsius", "GPU temperature.",
                                       labels, registry=self.registry),
                "sm_clock_mhz": Gauge("atomr_gpu_sm_clock_mhz", "SM clock.", labels,
                                      registry=self.registry),
                "ecc_errors": Gauge("atomr_gpu_ecc_uncorrected_errors",
                                    "Uncorrected ECC errors since the driver loaded.", labels,
                                    registry=self.registry),
                "memory_used": Gauge("atomr_gpu_memory_used_bytes", "GPU memory in use.",
                                     labels, registry=self.registry),
                "memory_total": Gauge("atomr_gpu_memory_total_bytes", "GPU memory.", labels,
                                      registry=self.registry),
            }
        for field, gauge in self._gpu.items():
            value = getattr(sample, field)
            if value is not None:
                gauge.labels(str(sample.index), sample.name).set(value)

    def unwatch(self, state: DeviceState) -> None:
        """Forget the device whose state is ``state`` (``System.drop_device``): it no longer
        counts for ``/readyz`` and its ops are no longer observed; its last figures stay."""
        if state in self._states:
            self._states.remove(state)
            state.remove_observer(self._ops)

    async def close_async(self) -> None:
        """Stop serving (the server's threads are waited for off the event loop, so that
        routes waiting on it finish), stop sampling and stop observing the devices."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.close)
        self._stop()

    def close(self) -> None:
        """Stop serving, stop sampling and stop observing the devices, from any thread but
        the system's event loop (there, await ``close_async``)."""
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.close()
        self._stop()

    def _stop(self) -> None:
        if self.dashboard is not None:
            self.dashboard.close()
        for state in self._states:
            state.remove_observer(self._ops)
        self._states.clear()
        self._sampler.tell(POISON_PILL)

    def __repr__(self) -> str:
        return f"Telemetry(devices={len(self._states)}, port={self.port})"
