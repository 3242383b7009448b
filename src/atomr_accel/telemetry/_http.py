"""A small HTTP server on a daemon thread: routes from a path to a function giving the answer."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["HttpServer", "Response", "Route"]


@dataclass(frozen=True, slots=True)
class Response:
    """What a route answers: a status, a content type and a body.

    ``stream``, when given, is written after the headers chunk by chunk (a
    Server-Sent Events stream); the connection ends when it is exhausted.
    """

    status: int
    content_type: str
    body: bytes = b""
    stream: Iterator[bytes] | None = None


Route = Callable[[], Response]
"""A route: called on the request's thread, it returns the ``Response``."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            response = Response(404, "text/plain; charset=utf-8", b"not found\n")
        else:
            try:
                response = route()
            except Exception as exc:  # an answer, never a dropped connection
                response = Response(503, "text/plain; charset=utf-8",
                                    f"{type(exc).__name__}: {exc}\n".encode())
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Cache-Control", "no-store")
        if response.stream is None:
            self.send_header("Content-Length", str(len(response.body)))
            self.end_headers()
            self.wfile.write(response.body)
            return
        self.end_headers()
        try:
            for chunk in response.stream:
                self.wfile.write(chunk)
                self.wfile.flush()
        except OSError:  # the client went away
            pass
        finally:
            close = getattr(response.stream, "close", None)
            if close is not None:
                close()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep quiet: a scrape every few seconds would flood stderr."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], routes: dict[str, Route]) -> None:
        self.routes = routes
        super().__init__(address, _Handler)


class HttpServer:
    """Serves GET routes on ``addr:port`` (0: a free port) from a daemon thread until ``close``.

    Routes may be added while it runs (``add``). Each request runs on a thread
    of its own; a route that raises answers 503 with the error's text.
    """

    def __init__(self, port: int = 0, addr: str = "127.0.0.1") -> None:
        self._routes: dict[str, Route] = {}
        self._server = _Server((addr, port), self._routes)
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

    def add(self, path: str, route: Route) -> None:
        """Answer GET ``path`` with ``route()`` (replacing any route of that path)."""
        self._routes[path] = route

    def has(self, path: str) -> bool:
        """Whether ``path`` has a route."""
        return path in self._routes

    def close(self) -> None:
        """Stop serving and release the port (streams still open end at their next chunk)."""
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)
