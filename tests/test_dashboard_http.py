"""The telemetry HTTP server under hostile clients: idle and slow connections, foreign Host
headers, tokens, hang-ups, bad ports; /healthz and /readyz through a killed worker; the
``atomr-accel dashboard`` command against a malformed endpoint."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from atomr_accel import (
    GpuRuntimeError,
    InvalidArgument,
    PortInUse,
    System,
    Unrecoverable,
)
from atomr_accel.cli import main

pytest.importorskip("prometheus_client")


def get(port: int, path: str, host: str | None = "127.0.0.1",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw GET (the Host header as given, or none); the status, headers and body."""
    lines = [f"GET {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append("Connection: close")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = read_all(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode().split("\r\n")
    fields = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), fields, body


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def connection_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "atomr-http-connection"]


# ------------------------------------------------------------------ connections


def test_connections_past_the_cap_are_refused_and_close_cuts_the_rest() -> None:
    with System.open("http") as system:
        system.spawn_device(mock=True)
        telemetry = system.enable_telemetry(interval=None)
        port = telemetry.serve(max_connections=4, read_timeout=60)
        system.serve_dashboard()
        stream = socket.create_connection(("127.0.0.1", port), timeout=10)
        stream.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        first = b""
        while b"data: " not in first:
            first += stream.recv(65536)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        idle[0].sendall(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # unfinished
        # connections are accepted in order: the fifth finds the four above holding the cap
        status, _, body = get(port, "/metrics")
        assert (status, body) == (503, b"too many connections; retry later\n")
        assert len(connection_threads()) == 4
    assert connection_threads() == []  # close() cut them and waited for their threads
    for sock in idle:
        assert read_all(sock) == b""  # the server's side is closed
        sock.close()
    rest = read_all(stream)  # the stream ends (after whole events only)
    stream.close()
    assert rest == b"" or rest.endswith(b"\n\n")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()


def test_a_request_not_sent_within_the_read_timeout_is_cut() -> None:
    with System.open("http") as system:
        telemetry = system.enable_telemetry(interval=None)
        port = telemetry.serve(read_timeout=0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
            started = time.monotonic()
            assert read_all(silent) == b""
            assert time.monotonic() - started < 5
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            started = time.monotonic()
            for byte in b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
                try:  # a byte every 0.1 s: each read is in time, the request never is
                    slow.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.1)
            assert read_all(slow) == b""
            assert time.monotonic() - started < 5
        assert get(port, "/metrics")[0] == 200  # the server still answers


def test_clients_that_hang_up_early_leave_no_trace(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    with System.open("http") as system:
        system.spawn_device(mock=True)
        port = system.serve_dashboard()
        for _ in range(10):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(b"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.close()  # reset before the answer is written
        deadline = time.monotonic() + 10
        while connection_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert connection_threads() == []
        assert get(port, "/api/state")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and r.name.startswith("atomr_accel.telemetry")]


# ------------------------------------------------------------------ who is answered


def test_only_ip_addresses_localhost_and_allowed_names_are_answered() -> None:
    with System.open("http") as system:
        system.spawn_device(mock=True, name="tenant-secret-model")
        port = system.serve_dashboard()
        for host in ("rebind.attacker.example", f"rebind.attacker.example:{port}",
                     "localhost.attacker.example", "127.0.0.1.nip.io", "", "a b",
                     "127.0.0.1:x", "[::1"):
            status, _, body = get(port, "/api/state", host=host)
            assert status == 403 and b"tenant" not in body, host
        for path in ("/", "/metrics", "/healthz", "/readyz", "/api/events", "/nothing"):
            assert get(port, path, host="rebind.attacker.example")[0] == 403, path
        for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.",
                     f"[::1]:{port}", "10.1.2.3", None):
            status, _, body = get(port, "/api/state", host=host)
            assert status == 200, host
            assert json.loads(body)["devices"][0]["name"] == "tenant-secret-model"


def test_allowed_hosts_adds_names_suffixes_or_everything() -> None:
    cases = [(["dash.internal"], {"dash.internal": 200, "DASH.internal:80": 200,
                                  "x.dash.internal": 403, "evil.example": 403}),
             (".corp.example", {"corp.example": 200, "a.b.corp.example": 200,
                                "corp.example.evil": 403, "xcorp.example": 403}),
             (["*"], {"anything.example": 200})]
    for allowed, expected in cases:
        with System.open("http") as system:
            port = system.serve_dashboard(allowed_hosts=allowed)
            assert {host: get(port, "/api/state", host=host)[0] for host in expected} == \
                expected
    with System.open("http") as system:
        for bad in (["a/b"], ["has space"], [""], [7], 5, ["http://x"]):
            with pytest.raises(InvalidArgument):
                system.serve_dashboard(allowed_hosts=bad)  # type: ignore[arg-type]
        port = system.serve_dashboard()
        with pytest.raises(InvalidArgument):  # served already, under other rules
            system.serve_dashboard(allowed_hosts=["dash.internal"])
        assert system.serve_dashboard() == port


def test_a_token_guards_everything_but_the_page_files_and_healthz() -> None:
    with System.open("http") as system:
        system.spawn_device(mock=True)
        port = system.serve_dashboard(token="s3cret-token")
        for path in ("/api/state", "/api/events", "/metrics", "/readyz"):
            status, headers, _ = get(port, path)
            assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
            assert get(port, path, headers={"Authorization": "Bearer wrong"})[0] == 401
            assert get(port, f"{path}?token=wrong")[0] == 401
        for path in ("/", "/dashboard.js", "/dashboard.css", "/healthz"):
            assert get(port, path)[0] == 200, path
        assert get(port, "/metrics", headers={"Authorization": "Bearer s3cret-token"})[0] == 200
        assert get(port, "/api/state?token=s3cret-token")[0] == 200
        assert main(["dashboard", "--url", f"http://127.0.0.1:{port}",
                     "--token", "s3cret-token"]) == 0
        assert main(["dashboard", "--url", f"http://127.0.0.1:{port}"]) == 1
        with pytest.raises(InvalidArgument):
            system.serve_dashboard(token="other-token")
    with System.open("http") as system:
        for bad in ("", "has space", "tab\t", 42):
            with pytest.raises(InvalidArgument):
                system.serve_dashboard(token=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ ports


@pytest.mark.parametrize("port", [70000, -1, "9400", 1.5, True, None])
def test_a_malformed_port_is_an_invalid_argument(port: Any) -> None:
    with System.open("http") as system:
        with pytest.raises(InvalidArgument):
            system.serve_dashboard(port)
        if port is not None:
            with pytest.raises(InvalidArgument):
                system.enable_telemetry(port=port)
        assert system.serve_dashboard() > 0  # nothing was left half served


def test_a_port_in_use_or_an_address_not_here_is_a_typed_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with System.open("http") as system:
            with pytest.raises(PortInUse) as info:
                system.serve_dashboard(port)
            assert (info.value.addr, info.value.port) == ("127.0.0.1", port)
            assert isinstance(info.value, InvalidArgument)
            assert isinstance(info.value, GpuRuntimeError)
            for addr in ("203.0.113.1", "", 5):  # an address of no interface here; malformed
                with pytest.raises(InvalidArgument):
                    system.serve_dashboard(0, addr)  # type: ignore[arg-type]
            served = system.serve_dashboard()
            assert served != port and get(served, "/healthz")[0] == 200


# ------------------------------------------------------------------ health


def ready(port: int) -> tuple[int, dict[str, Any]]:
    status, _, body = get(port, "/readyz")
    return status, json.loads(body)


def wait_for_status(port: int, wanted: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        status, answer = ready(port)
        if status == wanted or time.monotonic() > deadline:
            assert status == wanted, answer
            return answer
        time.sleep(0.01)


def test_readyz_follows_a_killed_worker_through_its_rebuild() -> None:
    with System.open("http") as system:
        port = system.enable_telemetry(port=0).port
        assert port is not None
        assert ready(port) == (200, {"ready": True, "devices": {}, "reasons": []})
        steady = system.spawn_device(mock=True, name="steady")
        victim = system.spawn_device(mock=True, name="victim", isolation="process")
        assert get(port, "/healthz")[:1] == (200,)
        assert ready(port) == (200, {"ready": True, "reasons": [],
                                     "devices": {"steady": "ready", "victim": "ready"}})
        generation = victim.stats().generation
        pid = victim.stats().host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        answer = wait_for_status(port, 503)
        assert answer["ready"] is False
        assert answer["devices"] == {"steady": "ready", "victim": "rebuilding"}
        [reason] = answer["reasons"]
        assert (reason["device"], reason["status"]) == ("victim", "rebuilding")
        assert "rebuilt" in reason["detail"]
        assert get(port, "/healthz")[0] == 200  # alive all along
        victim.allocate_f32(4)  # answered once the new context serves
        assert victim.stats().generation > generation
        assert ready(port)[0] == 200
        steady.allocate_f32(4)


def test_readyz_stays_503_for_a_stopped_device_until_it_is_dropped() -> None:
    with System.open("http") as system:
        port = system.enable_telemetry(port=0).port
        assert port is not None
        fragile = system.spawn_device(mock=True, name="fragile", isolation="process",
                                      max_restarts=0)
        pid = fragile.stats().host_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        answer = wait_for_status(port, 503)
        with pytest.raises(Unrecoverable):
            fragile.allocate_f32(4)
        answer = wait_for_status(port, 503)
        assert answer["devices"] == {"fragile": "stopped"}
        assert answer["reasons"][0]["status"] == "stopped"
        assert ready(port)[0] == 503  # still
        system.drop_device(fragile)
        assert ready(port) == (200, {"ready": True, "devices": {}, "reasons": []})


# ------------------------------------------------------------------ the CLI


ROW = {"name": "\x1b[2J\x1b]0;owned\x07gpu0", "backend": "cpu", "host": {"isolation": "thread"},
       "status": "ready", "generation": 1, "restarts": 0, "in_flight": 0, "queue_depth": 0,
       "memory": {"used": None, "total": None}}
STATES: dict[str, Any] = {
    "/missing-field": {"devices": [{}]},
    "/text-for-a-number": {"devices": [dict(ROW, memory={"used": "lots", "total": 1})]},
    "/bool-for-a-number": {"devices": [dict(ROW, generation=True)]},
    "/event-without-actor": {"devices": [], "events": [{"kind": "restart"}]},
    "/not-an-object": [1, 2],
    "/not-json": None,
    "/escapes": {"system": "\x1b[31mred", "devices": [ROW],
                 "events": [{"kind": "x", "device": None, "actor": "a",
                             "detail": "\x1b[2Jscreen cleared \u202eevil"}]},
}


@pytest.fixture
def stand_in() -> Iterator[int]:
    """A local endpoint answering ``STATES[prefix]`` at ``prefix/api/state``."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state = STATES.get(self.path.removesuffix("/api/state"))
            body = b"{not json" if state is None else json.dumps(state).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    server.server_close()
    thread.join()


def test_dashboard_command_refuses_a_malformed_state_and_escapes_text(
        stand_in: int, capsys: pytest.CaptureFixture[str]) -> None:
    for path in STATES:
        code = main(["dashboard", "--url", f"http://127.0.0.1:{stand_in}{path}"])
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out, path
        if path == "/escapes":
            assert code == 0
            assert "\\x1b[2J\\x1b]0;owned\\x07gpu0" in out and "\\u202eevil" in out
            assert "system '\\x1b[31mred'" in out
        else:
            assert code == 1 and "is not a dashboard" in out, (path, out)
    assert main(["dashboard", "--url", "file:///etc/passwd"]) == 1
    assert "not an http(s) URL" in capsys.readouterr().out
