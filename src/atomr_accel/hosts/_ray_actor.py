"""The Ray actor that holds one device context (``RayContext``); it imports no Ray itself.

``hosts/_ray.py`` wraps this class with ``ray.remote`` and starts one per context
generation. It is a synchronous, single-threaded actor: Ray runs the calls of
one caller in the order they were sent, one at a time, which is the order the
host promises (an asynchronous actor would cost about half a millisecond more
a call and order its calls only loosely).
"""

from __future__ import annotations

import importlib
import os
import pickle
import threading
from typing import Any

from atomr_accel.backends._base import Backend
from atomr_accel.core._errors import ContextPoisoned, GpuRuntimeError
from atomr_accel.core._op import Op
from atomr_accel.hosts._base import BackendSpec, picklable, refusal_of, translate_error

__all__ = ["RayContext"]

Reply = tuple[bool, Any]
"""``(True, result)`` or ``(False, the typed error)``: errors travel as values, not as
Ray task failures, so they come back with their own type."""


class RayContext:
    """One device context inside a Ray actor: builds the backend, runs one op a call."""

    def __init__(self, spec: BackendSpec) -> None:
        self.backend: Backend | None = None
        self.start_error: GpuRuntimeError | None = None
        try:
            self.backend = spec.create()
        except BaseException as exc:  # reported by ready(), never by a dead actor
            self.start_error = picklable(translate_error(exc, Op()))
        self.poisoned: GpuRuntimeError | None = None

    def ready(self) -> tuple[str, Any]:
        """``("ready", (pid, node id))`` or ``("error", the typed start-up error)``."""
        if self.start_error is not None:
            return "error", self.start_error
        return "ready", (os.getpid(), _node_id())

    def ping(self) -> None:
        """Answer at once: the owner's liveness probe."""

    def run_pickled(self, request: bytes) -> Reply:
        """``run`` of an op the owner pickled itself (``(op, stream)``)."""
        try:
            op, stream = pickle.loads(request)
        except Exception as exc:  # answer the request; never lose the context over it
            return False, picklable(refusal_of(exc, Op()))
        return self.run(op, stream)

    def run(self, op: Op, stream: int) -> Reply:
        """Run ``op`` on ``stream`` and answer once it has finished (errors as values)."""
        backend = self.backend
        if self.poisoned is not None or backend is None:
            return False, self.poisoned or ContextPoisoned("the context is closed")
        outcome: list[tuple[Any, BaseException | None]] = []
        finished = threading.Event()

        def done(result: Any, error: BaseException | None) -> None:
            outcome.append((result, error))
            finished.set()

        backend.launch(op, stream, done)
        if not finished.is_set():
            backend.flush()  # a deferred completion is reported now
            finished.wait()
        result, error = outcome[0]
        if error is None:
            return True, result
        failure = picklable(translate_error(error, op))
        if isinstance(failure, ContextPoisoned):
            self.poisoned = failure  # sticky, as in a real CUDA context
        return False, failure

    def drain(self) -> None:
        """Release the backend (every op sent before has been answered: calls run in order);
        the owner kills the actor next."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None


def _node_id() -> str | None:
    """The Ray node this actor runs on (None if Ray cannot say)."""
    try:
        ray = importlib.import_module("ray")
        return str(ray.get_runtime_context().get_node_id())
    except Exception:
        return None
