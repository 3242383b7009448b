"""A small HTTP server on a daemon thread: routes from a path to a function giving the answer.

It runs inside a GPU-serving process, so whoever can connect must not be able to
hold its threads or flood its logs: each connection has a thread of its own, but
there are at most ``max_connections`` (more are answered 503 and closed), a
request must arrive whole within ``read_timeout`` seconds (every socket read
and write has that time-out too), a client that hangs up is nothing to report,
and ``close`` shuts every connection and waits for its thread. Who is answered
at all is ``Access``'s decision (the ``Host`` allow list and the token).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import TCPServer
from typing import Any

from atomr_accel.core._errors import InvalidArgument, PortInUse
from atomr_accel.telemetry._access import Access

__all__ = ["MAX_CONNECTIONS", "READ_TIMEOUT", "HttpServer", "Response", "Route"]

_log = logging.getLogger("atomr_accel.telemetry")

MAX_CONNECTIONS = 64
"""Connections served at once by default (each holds a thread while it is open)."""

READ_TIMEOUT = 10.0
"""Seconds a client has by default to send its whole request, and for each read or write."""

JOIN_SECONDS = 5.0
"""How long ``close`` waits for the connections' threads to end."""

_TEXT = "text/plain; charset=utf-8"
_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 34\r\nConnection: close\r\n\r\ntoo many connections; retry later\n")


@dataclass(frozen=True, slots=True)
class Response:
    """What a route answers: a status, a content type and a body.

    ``stream``, when given, is written after the headers chunk by chunk (a
    Server-Sent Events stream); the connection ends when it is exhausted.
    ``headers`` are sent as well.
    """

    status: int
    content_type: str
    body: bytes = b""
    stream: Iterator[bytes] | None = None
    headers: tuple[tuple[str, str], ...] = ()


Route = Callable[[], Response]
"""A route: called on the request's thread, it returns the ``Response``."""


@dataclass(slots=True)
class _Connection:
    """One open connection: its thread, and since when it reads a request (None once read)."""

    thread: threading.Thread
    reading_since: float | None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        self.request.settimeout(self.server.read_timeout)  # each read and write of it
        super().setup()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        self.server.request_read(self.request)
        return parsed

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        response = self._answer(path, query)
        try:
            self._send(response)
        except OSError:  # the client went away, or stopped reading
            pass
        finally:
            close = getattr(response.stream, "close", None)
            if close is not None:
                close()

    def _answer(self, path: str, query: str) -> Response:
        access = self.server.access
        if not access.host_allowed(self.headers.get("Host")):
            return Response(403, _TEXT, b"this Host is not allowed: see allowed_hosts\n")
        entry = self.server.routes.get(path)
        if entry is None:
            return Response(404, _TEXT, b"not found\n")
        route, public = entry
        if not public and not access.authorized(self.headers.get("Authorization"), query):
            return Response(401, _TEXT, b"a token is needed\n",
                            headers=(("WWW-Authenticate", 'Bearer realm="atomr-accel"'),))
        try:
            return route()
        except Exception as exc:  # an answer, never a dropped connection
            return Response(503, _TEXT, f"{type(exc).__name__}: {exc}\n".encode())

    def _send(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in response.headers:
            self.send_header(name, value)
        if response.stream is None:
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
            return
        self.end_headers()
        for chunk in response.stream:
            self.wfile.write(chunk)
            self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep quiet: a scrape every few seconds would flood stderr."""


class _Server(HTTPServer):
    """Threads per connection, as ``ThreadingHTTPServer``, but counted, capped, reaped."""

    request_queue_size = 128  # the listen backlog: a burst of connections waits to be accepted

    def __init__(self, address: tuple[str, int], routes: dict[str, tuple[Route, bool]],
                 access: Access, max_connections: int, read_timeout: float) -> None:
        self.routes = routes
        self.access = access
        self.max_connections = max_connections
        self.read_timeout = read_timeout
        self.connections: dict[socket.socket, _Connection] = {}
        self.lock = threading.Lock()
        self.closing = False
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        """Bind without ``HTTPServer``'s reverse DNS lookup of the address."""
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve ``request`` on a thread of its own, or refuse it past the cap."""
        thread = threading.Thread(target=self._serve, args=(request, client_address),
                                  name="atomr-http-connection", daemon=True)
        with self.lock:
            admitted = not self.closing and len(self.connections) < self.max_connections
            if admitted:
                self.connections[request] = _Connection(thread, time.monotonic())
        if not admitted:
            _refuse(request)
            self.shutdown_request(request)
            return
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self.lock:
                self.connections.pop(request, None)

    def request_read(self, request: Any) -> None:
        """The request on ``request`` is read: it is answered now, for as long as it takes."""
        with self.lock:
            connection = self.connections.get(request)
            if connection is not None:
                connection.reading_since = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up or times out is no news; anything else is a bug: log it."""
        _log.exception("the telemetry HTTP server failed to answer %s", client_address)

    def finish_request(self, request: Any, client_address: Any) -> None:
        with contextlib.suppress(OSError):  # reset, broken pipe, time-out: the client's doing
            super().finish_request(request, client_address)

    def service_actions(self) -> None:
        """Cut the connections that took longer than ``read_timeout`` to send a request
        (on the serving thread, every half second)."""
        limit = time.monotonic() - self.read_timeout
        with self.lock:
            late = [s for s, c in self.connections.items()
                    if c.reading_since is not None and c.reading_since < limit]
        _cut(late)

    def drop_all(self) -> list[threading.Thread]:
        """Refuse new connections and cut every open one; return their threads."""
        with self.lock:
            self.closing = True
            sockets = list(self.connections)
            threads = [c.thread for c in self.connections.values()]
        _cut(sockets)
        return threads


def _cut(sockets: Iterable[socket.socket]) -> None:
    """Shut ``sockets`` down both ways: a thread blocked reading or writing one wakes up."""
    for sock in sockets:
        with contextlib.suppress(OSError):  # closed already
            sock.shutdown(socket.SHUT_RDWR)


def _refuse(request: socket.socket) -> None:
    """Tell a connection past the cap to come back later, without waiting for it."""
    try:
        request.setblocking(False)
        request.send(_BUSY)
    except OSError:
        pass


class HttpServer:
    """Serves GET routes on ``addr:port`` (0: a free port) from a daemon thread until ``close``.

    Routes may be added while it runs (``add``). Each connection runs on a
    thread of its own, ``max_connections`` at most (more are answered 503); a
    request must arrive within ``read_timeout`` seconds. ``access`` says which
    ``Host`` names are answered (403 otherwise) and which token the routes not
    added as public need (401 otherwise). A route that raises answers 503 with
    the error's text. Raises ``InvalidArgument`` for a malformed port, address
    or limit, or an address it cannot listen on, and ``PortInUse`` when
    another server has the port.
    """

    def __init__(self, port: int = 0, addr: str = "127.0.0.1", access: Access | None = None,
                 *, max_connections: int = MAX_CONNECTIONS,
                 read_timeout: float = READ_TIMEOUT) -> None:
        _check(port, addr, max_connections, read_timeout)
        self._routes: dict[str, tuple[Route, bool]] = {}
        self.access = access or Access()
        """The ``Host`` allow list and token this server applies."""
        try:
            self._server = _Server((addr, port), self._routes, self.access, max_connections,
                                   float(read_timeout))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(addr, port) from exc
            raise InvalidArgument(f"cannot serve HTTP on {addr}:{port}: {exc}") from exc
        self.closing = threading.Event()
        """Set by ``close``: long-lived streams end when they see it."""
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"atomr-http-{self.port}", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port served."""
        return int(self._server.server_port)

    @property
    def addr(self) -> str:
        """The address served."""
        return str(self._server.server_address[0])

    def add(self, path: str, route: Route, *, public: bool = False) -> None:
        """Answer GET ``path`` with ``route()`` (replacing any route of that path); a
        ``public`` route is answered without the token."""
        self._routes[path] = (route, public)

    def has(self, path: str) -> bool:
        """Whether ``path`` has a route."""
        return path in self._routes

    def close(self) -> None:
        """Stop serving, release the port, cut every open connection and wait (a few
        seconds at most) for their threads. Call it from any thread but one a route
        waits for (a system's event loop: there, await ``asyncio.to_thread(close)``)."""
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in [*self._server.drop_all(), self._thread]:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _check(port: object, addr: object, max_connections: object, read_timeout: object) -> None:
    """Refuse malformed server options with ``InvalidArgument``."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidArgument(f"port must be an int from 0 (any free port) to 65535, "
                              f"got {port!r}")
    if not isinstance(addr, str) or not addr:
        raise InvalidArgument(f"addr must be an address or host name (a str), got {addr!r}")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) \
            or max_connections < 1:
        raise InvalidArgument(f"max_connections must be an int >= 1, got {max_connections!r}")
    if isinstance(read_timeout, bool) or not isinstance(read_timeout, int | float) \
            or not 0 < read_timeout < float("inf"):
        raise InvalidArgument(f"read_timeout must be a number of seconds > 0, "
                              f"got {read_timeout!r}")
