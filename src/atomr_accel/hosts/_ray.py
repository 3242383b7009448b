"""The Ray host: the context lives in a Ray actor, on any node of a Ray cluster.

Each context generation is one actor (``RayContext``), asking Ray for one GPU
when the backend is CUDA and one CPU otherwise; ``node`` pins it to a node (a
soft node affinity, so a rebuild after the node is lost lands on a surviving
one) and ``ray_options`` go to Ray as they are (custom resources, a placement
group, ...). Ops travel as Ray calls, in order: an op holding NumPy arrays
goes through Ray's serializer and object store (zero-copy on the way in: the
backend copies them into device memory), any other op as a pickle made here
(Ray's serializer costs about 0.15 ms more a call); replies and errors come
back as values with their own types. When the
actor dies (``ray.kill``, its node lost) every op in flight fails with
``WorkerLost`` and ``died`` resolves, so supervision rebuilds the context.
Ray itself is imported lazily: the package works without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import logging
import pickle
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from atomr_accel.backends import capabilities
from atomr_accel.core._errors import (
    ContextPoisoned,
    DeviceUnavailable,
    GpuRuntimeError,
    WorkerLost,
    interrupt_in,
)
from atomr_accel.core._op import Op
from atomr_accel.hosts._base import (
    BackendSpec,
    ContextHost,
    Done,
    Outcome,
    Ticket,
    refusal_of,
    translate_error,
)
from atomr_accel.hosts._ray_actor import RayContext

__all__ = ["RayHost", "ensure_ray", "ray_module"]

_log = logging.getLogger(__name__)

_PROBE_SECONDS = 0.5
"""How often an idle context actor is asked whether it lives (its death is noticed by then)."""
_CLOSE_GRACE = 5.0
"""How long ``close`` lets the actor finish the ops it was sent before killing it."""
_SUSPECT_SECONDS = 60.0
"""How long a node whose context actor died is avoided by new context actors: Ray may take
many seconds to declare a lost node dead, and would place a rebuild there meanwhile."""

_suspects: dict[str, float] = {}
_suspects_lock = threading.Lock()


def _suspect(node_id: str) -> None:
    with _suspects_lock:
        _suspects[node_id] = time.monotonic() + _SUSPECT_SECONDS


def _suspected() -> set[str]:
    """Nodes that lost a context actor lately."""
    now = time.monotonic()
    with _suspects_lock:
        for node_id in [n for n, until in _suspects.items() if until <= now]:
            del _suspects[node_id]
        return set(_suspects)


def ray_module() -> Any:
    """The ``ray`` module; ``DeviceUnavailable`` when Ray is not installed."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise DeviceUnavailable(
            "isolation='ray' needs Ray: pip install 'atomr-accel-py[ray]'") from exc


def ensure_ray(address: str | None = None) -> tuple[Any, bool]:
    """Connect this process to Ray unless it is already: ``address`` is ``"auto"``, a
    cluster's address, or None / ``"local"`` for a new local Ray. Returns the module and
    whether this call connected it.

    None is passed to Ray as ``"local"``: Ray's own None would join ``$RAY_ADDRESS`` or
    the cluster last started on this machine; joining one takes its address.
    """
    ray = ray_module()
    if ray.is_initialized():
        return ray, False
    where = "local" if address is None else address
    try:
        _on_lasting_thread(functools.partial(
            ray.init, address=where, include_dashboard=False, log_to_driver=False,
            configure_logging=False))
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise DeviceUnavailable(f"could not connect to Ray at {address!r}: {exc}") from exc
    return ray, True


def _on_lasting_thread(init: Callable[[], Any]) -> None:
    """Run ``init`` on the main thread, or else on a thread that never ends: a local Ray's
    processes are killed when the thread that started them exits (parent-death signal),
    and executor and event-loop threads do exit."""
    if threading.current_thread() is threading.main_thread():
        init()
        return
    outcome: list[BaseException | None] = []
    started = threading.Event()

    def keep() -> None:
        try:
            init()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)
        started.set()
        threading.Event().wait()  # lives as long as the process: Ray's processes with it

    threading.Thread(target=keep, name="atomr-ray-keeper", daemon=True).start()
    started.wait()
    if outcome[0] is not None:
        raise outcome[0]


@functools.cache
def _remote_context(ray: Any) -> Any:
    """``RayContext`` as a Ray actor class (made once per process)."""
    return ray.remote(RayContext)


class RayHost(ContextHost):
    """Runs the context in a Ray actor (one per generation); see the module's docstring.

    ``start_timeout`` bounds the wait for Ray to place and start the actor (a
    cluster without the resources asked for leaves it pending: that is a
    ``DeviceUnavailable`` once the time is up).
    """

    kind: ClassVar[str] = "ray"

    def __init__(self, spec: BackendSpec, node: str | None = None,
                 ray_options: Mapping[str, Any] | None = None,
                 start_timeout: float = 120.0) -> None:
        super().__init__(spec)
        self.node = node
        self.ray_options = dict(ray_options or {})
        self.start_timeout = start_timeout
        self.node_id: str | None = None
        """The Ray node the context runs on (once started)."""
        self._actor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        """Guards the order of sends: claim and submission happen together, in sequence."""
        self._probing = False
        self._timer: asyncio.TimerHandle | None = None
        self._dead: GpuRuntimeError | None = None
        self._closing = False
        self._pid: int | None = None

    def actor_options(self) -> dict[str, Any]:
        """What the context actor asks Ray for (``ray_options`` override these)."""
        options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0}
        if capabilities(self.spec.name).needs_gpu:
            options["num_gpus"] = 1
        else:
            options["num_cpus"] = 1
        node = self.node
        suspects = _suspected()
        if suspects and (node is None or node in suspects):
            node = self._elsewhere(suspects)  # steer clear of a node that just lost one
        if node is not None:
            strategies = importlib.import_module("ray.util.scheduling_strategies")
            options["scheduling_strategy"] = strategies.NodeAffinitySchedulingStrategy(
                node_id=node, soft=True)
        options.update(self.ray_options)
        return options

    def _elsewhere(self, suspects: set[str]) -> str | None:
        """A live node, not suspected, with the resources this context asks for (None:
        let Ray choose)."""
        needs = {"GPU" if capabilities(self.spec.name).needs_gpu else "CPU": 1.0,
                 **self.ray_options.get("resources", {})}
        nodes = [str(n["NodeID"]) for n in ray_module().nodes()
                 if n.get("Alive") and n["NodeID"] not in suspects
                 and all(n.get("Resources", {}).get(k, 0) >= v for k, v in needs.items())]
        return random.choice(nodes) if nodes else None

    async def start(self) -> None:
        """Start the actor and build the backend in it; ``DeviceUnavailable`` if Ray cannot."""
        loop = self._loop = asyncio.get_running_loop()
        self.died = loop.create_future()
        if not ray_module().is_initialized():
            await asyncio.to_thread(ensure_ray)
        ray = ray_module()
        spec = self.spec
        if capabilities(spec.name).needs_gpu:  # Ray shows the actor its one GPU as device 0
            spec = dataclasses.replace(spec, device_id=0)
        try:
            self._actor = _remote_context(ray).options(**self.actor_options()).remote(spec)
            async with asyncio.timeout(self.start_timeout):
                status, info = await asyncio.wrap_future(self._actor.ready.remote().future())
        except BaseException as exc:
            self._kill()
            if isinstance(exc, TimeoutError):
                raise DeviceUnavailable(
                    f"Ray placed no actor for the {self.spec.name} context within "
                    f"{self.start_timeout:g} s (asked for {self._asked()})") from exc
            if isinstance(exc, Exception) and not isinstance(exc, GpuRuntimeError):
                raise DeviceUnavailable(f"the Ray actor of the {self.spec.name} context did "
                                        f"not start: {exc}") from exc
            raise
        if status != "ready":
            self._kill()
            raise info
        self._pid, self.node_id = info
        self._timer = loop.call_later(_PROBE_SECONDS, self._tick)

    def _asked(self) -> str:
        options = self.actor_options()
        return ", ".join(f"{k}={options[k]!r}" for k in options
                         if k not in ("max_restarts", "max_task_retries"))

    # ------------------------------------------------------------ ways in

    def _send(self, op: Op, stream: int, ticket: Ticket) -> Any:
        """Claim ``op`` and send it, in order (Ray runs one caller's calls to a synchronous
        actor in the order sent): its ObjectRef, a refusal (an op that cannot travel) or
        None (not claimed, or handed back: the actor is gone or closing)."""
        with self._lock:
            if self._dead is not None or self._closing or self._actor is None:
                ticket.unclaim()
                return None
            if not ticket.claim():
                return None
            try:
                if _carries_arrays(op):  # through Ray's serializer: zero-copy NumPy
                    return self._actor.run.remote(op, stream)
                return self._actor.run_pickled.remote(  # small: pickled here, cheaper
                    pickle.dumps((op, stream), pickle.HIGHEST_PROTOCOL))
            except Exception as exc:
                if interrupt_in(exc) is not None:  # the sending thread was interrupted
                    raise
                return refusal_of(exc, op)

    def launch(self, op: Op, stream: int, ticket: Ticket, done: Done) -> None:
        """Send ``op`` as a Ray call; ``done`` hears its reply on Ray's thread."""
        sent = self._send(op, stream, ticket)
        if sent is None:
            return
        if isinstance(sent, GpuRuntimeError):
            done(None, sent)
            return
        sent.future().add_done_callback(functools.partial(self._reply, op, done))

    def _reply(self, op: Op, done: Done, fut: Any) -> None:
        outcome: Outcome
        try:
            reply = fut.result()
        except Exception as exc:
            outcome = None, self._failure(exc, op)
        else:
            outcome = _outcome(reply)
        try:
            done(*outcome)
        except Exception:  # whoever takes the answer failed: not a reason to lose the context
            _log.exception("answering %s failed", type(op).__name__)

    def call(self, op: Op, stream: int, ticket: Ticket,
             deadline: float | None) -> Outcome | None:
        """Send ``op`` and wait for its reply here (``ray.get`` with the time left)."""
        sent = self._send(op, stream, ticket)
        if sent is None:
            return None
        if isinstance(sent, GpuRuntimeError):
            return None, sent
        ray = ray_module()
        timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            reply = ray.get(sent, timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError("the op did not finish before its deadline") from exc
        except Exception as exc:
            if interrupt_in(exc) is not None:  # this thread was interrupted: the caller's
                raise
            return None, self._failure(exc, op)
        return _outcome(reply)

    def _failure(self, exc: BaseException, op: Op) -> GpuRuntimeError:
        """The typed error of a Ray call that failed: the actor's death, or its reply lost
        with its node, is ``WorkerLost`` (``ContextPoisoned`` once the host is closing)."""
        if self._closing:
            error: GpuRuntimeError = ContextPoisoned(
                "the context was closed before this op finished")
        elif isinstance(exc, _lost_with_the_actor()):
            error = self._lose(exc)
        else:
            return translate_error(exc, op)
        error.__cause__ = exc
        return error

    # -------------------------------------------------------------- death

    def _tick(self) -> None:
        """Probe the actor every ``_PROBE_SECONDS`` on the owner's loop while it serves, so
        that an idle context whose actor died is rebuilt before anyone asks it for work."""
        if self.probe() and self._loop is not None:
            self._timer = self._loop.call_later(_PROBE_SECONDS, self._tick)

    def probe(self) -> bool:
        """Ask the actor whether it lives unless a probe is out already; False once the
        host is closing or has lost its actor (stop probing it)."""
        with self._lock:
            if self._dead is not None or self._closing or self._actor is None:
                return False
            if self._probing:
                return True
            self._probing = True
            actor = self._actor
        try:
            actor.ping.remote().future().add_done_callback(self._probed)
        except Exception as exc:
            self._lose(exc)
            return False
        return True

    def _probed(self, fut: Any) -> None:
        exc = fut.exception()
        with self._lock:
            self._probing = False
        if exc is not None and not self._closing:
            self._lose(exc)

    def _lose(self, exc: BaseException) -> GpuRuntimeError:
        """Record the actor's death (once) and tell the owner's loop; returns the error."""
        with self._lock:
            if self._dead is None:
                self._dead = WorkerLost(
                    f"the Ray actor of {self.spec.name} device {self.spec.device_id} "
                    f"(pid {self._pid}, node {self.node_id}) died: {type(exc).__name__}")
                self._dead.__cause__ = exc
                first = True
                if self.node_id is not None:
                    _suspect(self.node_id)
            else:
                first = False
            error = self._dead
        if first and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting
                self._loop.call_soon_threadsafe(self._mark_died, error)
        return error

    # -------------------------------------------------------------- life

    @property
    def pid(self) -> int | None:
        """The actor's process id (on its node)."""
        return self._pid

    async def close(self) -> None:
        """Let the actor finish what it was sent (up to 5 s), then kill it; ops still in
        flight fail with ``ContextPoisoned``."""
        actor = self._actor
        if actor is None:
            return
        with self._lock:
            self._closing = True
            dead = self._dead is not None
        if self._timer is not None:
            self._timer.cancel()
        if not dead:
            drained = actor.drain.remote()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_CLOSE_GRACE):
                    await asyncio.wrap_future(drained.future())
        self._kill()

    def _kill(self) -> None:
        actor, self._actor = self._actor, None
        if actor is not None:
            with contextlib.suppress(Exception):  # gone already
                ray_module().kill(actor, no_restart=True)


def _lost_with_the_actor() -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the actor (or its node, with the reply) is gone."""
    errors = ray_module().exceptions
    return (errors.RayActorError, errors.ObjectLostError)


def _carries_arrays(op: Op) -> bool:
    """Whether ``op`` holds a NumPy array (an upload's payload)."""
    return dataclasses.is_dataclass(op) and any(
        isinstance(getattr(op, f.name, None), np.ndarray) for f in dataclasses.fields(op))


def _outcome(reply: tuple[bool, Any]) -> Outcome:
    ok, payload = reply
    if not ok:
        return None, payload
    if isinstance(payload, np.ndarray) and not payload.flags.writeable:
        payload = payload.copy()  # a view of Ray's object store: the caller owns its result
    return payload, None
