"""``atomr-accel dashboard``: attach to a running system's dashboard endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import IO, Any

from atomr_accel.cli._table import format_bytes, format_table

__all__ = ["attach_dashboard"]


def attach_dashboard(out: IO[str], url: str, timeout: float = 5.0) -> int:
    """Read ``url``'s ``/api/state`` (a system served with ``system.serve_dashboard``),
    print where to open its page and a table of its devices; return 0, or 1 when the
    endpoint cannot be reached or is not a dashboard.

    It does not proxy: the page is served by the system itself, at ``url``.
    """
    base = url.rstrip("/")
    try:
        with urllib.request.urlopen(f"{base}/api/state", timeout=timeout) as response:
            state: dict[str, Any] = json.loads(response.read())
        devices = state["devices"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"cannot reach a dashboard at {base}: {reason}", file=out)
        return 1
    print(f"system {state.get('system', '?')!r}: open {base}/ in a browser "
          f"(live; /api/state and /api/events for scripts, /metrics for Prometheus)",
          file=out)
    rows = [(d["name"], d["backend"], d["host"]["isolation"], d["status"], d["generation"],
             d["restarts"], d["in_flight"], d["queue_depth"],
             format_bytes(d["memory"]["used"]), format_bytes(d["memory"]["total"]))
            for d in devices]
    print(format_table(["device", "backend", "host", "status", "generation", "restarts",
                        "in flight", "queued", "memory used", "memory total"], rows), file=out)
    events = state.get("events", [])[-5:]
    if events:
        print("recent supervision events:", file=out)
        for event in events:
            print(f"  {event['kind']} {event['device'] or event['actor']}: {event['detail']}",
                  file=out)
    return 0
