"""``atomr-accel dashboard``: attach to a running system's dashboard endpoint.

What the endpoint sends is not trusted: the state is checked field by field
before anything is printed (a malformed one is "not a dashboard"), and every
text from it is printed with its control characters escaped, so a device name
cannot move the cursor, clear the screen or retitle the terminal.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import IO, Any

from atomr_accel.cli._table import format_bytes, format_table

__all__ = ["attach_dashboard"]

MAX_STATE_BYTES = 16 << 20
"""The largest ``/api/state`` answer read."""


class _NotADashboard(Exception):
    """The endpoint answered, but not with a dashboard's state."""


def attach_dashboard(out: IO[str], url: str, timeout: float = 5.0,
                     token: str | None = None) -> int:
    """Read ``url``'s ``/api/state`` (a system served with ``system.serve_dashboard``),
    print where to open its page and a table of its devices; return 0, or 1 when the
    endpoint cannot be reached or is not a dashboard.

    ``token`` is sent as ``Authorization: Bearer`` (a system served with one). It
    does not proxy: the page is served by the system itself, at ``url``.
    """
    base = url.rstrip("/")
    if urllib.parse.urlsplit(base).scheme not in ("http", "https"):
        print(f"not an http(s) URL: {_clean(base)}", file=out)
        return 1
    request = urllib.request.Request(f"{base}/api/state")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read(MAX_STATE_BYTES + 1)
    except OSError as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        print(f"cannot reach a dashboard at {_clean(base)}: {_clean(str(reason))}", file=out)
        return 1
    try:
        if len(body) > MAX_STATE_BYTES:
            raise _NotADashboard(f"its state is larger than {MAX_STATE_BYTES} bytes")
        system, rows, events = _read_state(body)
    except _NotADashboard as exc:
        print(f"{_clean(base)} is not a dashboard: {exc}", file=out)
        return 1
    print(f"system '{system}': open {_clean(base)}/ in a browser "
          f"(live; /api/state and /api/events for scripts, /metrics for Prometheus)",
          file=out)
    print(format_table(["device", "backend", "host", "status", "generation", "restarts",
                        "in flight", "queued", "memory used", "memory total"], rows), file=out)
    if events:
        print("recent supervision events:", file=out)
        for line in events:
            print(f"  {line}", file=out)
    return 0


def _read_state(body: bytes) -> tuple[str, list[tuple[Any, ...]], list[str]]:
    """The system's name, the device rows and the last five event lines of a state, all
    text escaped; ``_NotADashboard`` when a field is missing or of the wrong type."""
    try:
        state = json.loads(body)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise _NotADashboard(f"its answer is not JSON ({exc})") from None
    state = _field(state, "state", dict)
    rows = []
    for item in _field(state.get("devices"), "devices", list):
        device = _field(item, "a device", dict)
        memory = _field(device.get("memory"), "memory", dict)
        host = _field(device.get("host"), "host", dict)
        rows.append((
            _text(device, "name"), _text(device, "backend"), _text(host, "isolation"),
            _text(device, "status"),
            *(_count(device, key) for key in ("generation", "restarts", "in_flight",
                                              "queue_depth")),
            format_bytes(_count(memory, "used", nullable=True)),
            format_bytes(_count(memory, "total", nullable=True))))
    lines = []
    for item in _field(state.get("events", []), "events", list)[-5:]:
        event = _field(item, "an event", dict)
        where = _text(event, "device", nullable=True) or _text(event, "actor")
        lines.append(f"{_text(event, 'kind')} {where}: {_text(event, 'detail')}")
    system = state.get("system", "?")
    return _clean(system if isinstance(system, str) else "?"), rows, lines


def _field(value: Any, what: str, kind: type) -> Any:
    if not isinstance(value, kind):
        raise _NotADashboard(f"{what} is not a JSON {kind.__name__} ({type(value).__name__})")
    return value


def _text(row: dict[str, Any], key: str, *, nullable: bool = False) -> str:
    value = row.get(key)
    if value is None and nullable:
        return ""
    if not isinstance(value, str):
        raise _NotADashboard(f"field {key!r} is not text ({type(value).__name__})")
    return _clean(value)


def _count(row: dict[str, Any], key: str, *, nullable: bool = False) -> Any:
    value = row.get(key)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _NotADashboard(f"field {key!r} is not an integer ({type(value).__name__})")
    return value


def _clean(text: str) -> str:
    """``text`` with every character that is not printable (control characters, escape
    sequences' ESC, bidirectional overrides) written as a Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)
