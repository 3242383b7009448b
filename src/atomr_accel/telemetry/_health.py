"""Health for orchestrators: ``/healthz`` (the process answers) and ``/readyz`` (every
device serves), read from each device's ``DeviceState`` as it changes, never by running ops.

A device's status is set by its device actor as its context goes down, is rebuilt
and serves again (``Status``), and its state is shut once the device actor has
stopped; readiness is a pure function of those, so a probe costs no actor hop
and never queues behind work.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from atomr_accel.device import DeviceState, Status
from atomr_accel.telemetry._http import Response

__all__ = ["health", "readiness", "ready_response"]

_WHY = {
    Status.STARTING: "its first context is starting",
    Status.REBUILDING: "its context is down and being rebuilt; requests wait for it",
    Status.STOPPED: "it has stopped serving for good (restart budget spent, or an "
                    "unrecoverable error): requests fail",
}


def readiness(states: Iterable[DeviceState]) -> dict[str, Any]:
    """Whether every device of ``states`` serves: ``{"ready": bool, "devices": {name:
    status}, "reasons": [{"device", "status", "generation", "detail"}, ...]}``, one
    reason per device that does not (JSON-ready). No devices: ready."""
    devices: dict[str, str] = {}
    reasons = []
    for state in states:
        status = Status.STOPPED if state.shut_error is not None else state.status
        devices[state.name] = status.value
        if status is Status.READY:
            continue
        detail = _WHY[status]
        error = state.shut_error or state.start_error
        if status is Status.STOPPED and error is not None:
            detail += f": {type(error).__name__}: {error}"
        reasons.append({"device": state.name, "status": status.value,
                        "generation": state.generation, "detail": detail})
    return {"ready": not reasons, "devices": devices, "reasons": reasons}


def ready_response(states: Iterable[DeviceState]) -> Response:
    """``/readyz``: 200 with ``readiness`` as JSON when every device serves, else 503."""
    answer = readiness(states)
    return Response(200 if answer["ready"] else 503, "application/json",
                    json.dumps(answer).encode())


def health() -> Response:
    """``/healthz``: 200 whenever the server answers (the process is alive)."""
    return Response(200, "application/json", b'{"alive": true}')
