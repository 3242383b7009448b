"""Who the telemetry HTTP server answers: a Host-header allow list, and an optional token.

A web page the user visits can re-point its own name at 127.0.0.1 (DNS
rebinding) and read whatever a local server answers, since the browser then
treats that server as the page's own origin. The page cannot choose the
``Host`` header its requests carry, though: it is the page's name. So the
server answers only requests whose ``Host`` is an IP address (no name to
rebind), ``localhost``, or a name the operator allowed; everything else gets
403. A bearer token, when set, is asked of every request but the public ones
(the page's static files and ``/healthz``). Pure decisions, no I/O: the server
asks them of each request's headers.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qs

from atomr_accel.core._errors import InvalidArgument

__all__ = ["LOOPBACK_NAMES", "Access"]

LOOPBACK_NAMES = ("localhost",)
"""The names always allowed as ``Host`` (besides any IP address)."""

_HOST = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_ENTRY = re.compile(r"\*|\.?" + _HOST.pattern)
_TOKEN = re.compile(r"[!-~]+")  # visible ASCII: fits a header and a query


@dataclass(frozen=True, slots=True)
class Access:
    """The rules one server applies: extra ``Host`` names allowed, and the token if any.

    ``allowed_hosts`` entries are names (``dash.internal``, matched exactly), a
    suffix with a leading dot (``.corp.example``: that name and every name under
    it) or ``*`` (any ``Host``: turns the check off). IP addresses and
    ``localhost`` need no entry. ``token`` is compared in constant time with the
    ``Authorization: Bearer <token>`` header or a ``token`` query parameter.
    """

    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None

    @classmethod
    def of(cls, allowed_hosts: Iterable[str] | str | None = None,
           token: str | None = None) -> Access:
        """Check and normalize the options (``InvalidArgument`` when one is malformed); a
        single name may be given as a str."""
        if allowed_hosts is None:
            names: tuple[str, ...] = ()
        elif isinstance(allowed_hosts, str):
            names = (allowed_hosts,)
        else:
            try:
                names = tuple(allowed_hosts)
            except TypeError as exc:
                raise InvalidArgument(
                    f"allowed_hosts must be names (an iterable of str), got {allowed_hosts!r}"
                ) from exc
        normalized = []
        for name in names:
            if not isinstance(name, str) or not _ENTRY.fullmatch(name.lower().rstrip(".")):
                raise InvalidArgument(f"allowed_hosts: {name!r} is not a host name, a "
                                      "'.suffix' or '*'")
            normalized.append(name.lower().rstrip("."))
        if token is not None and (not isinstance(token, str) or not _TOKEN.fullmatch(token)):
            raise InvalidArgument("token must be a non-empty str of visible ASCII characters "
                                  "(no spaces)")
        return cls(tuple(normalized), token)

    def host_allowed(self, host: str | None) -> bool:
        """Whether a request whose ``Host`` header is ``host`` may be answered (no header:
        not a browser, allowed)."""
        if host is None:
            return True
        name = _hostname(host)
        if name is None:
            return False
        if name in LOOPBACK_NAMES or _is_ip(name) or "*" in self.allowed_hosts:
            return True
        return any(name == entry or (entry.startswith(".") and
                                     (name == entry[1:] or name.endswith(entry)))
                   for entry in self.allowed_hosts)

    def authorized(self, authorization: str | None, query: str) -> bool:
        """Whether a request with this ``Authorization`` header and query string carries
        the token (always, when there is no token)."""
        if self.token is None:
            return True
        given = []
        if authorization is not None:
            scheme, _, credentials = authorization.strip().partition(" ")
            if scheme.lower() == "bearer":
                given.append(credentials.strip())
        given.extend(parse_qs(query).get("token", []))
        expected = self.token.encode()
        return any(hmac.compare_digest(g.encode(), expected) for g in given)


def _hostname(host: str) -> str | None:
    """The name or address of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``),
    lower case, without a trailing dot; None when malformed."""
    host = host.strip().lower()
    if host.startswith("["):
        address, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return address if _is_ip(address) else None
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return None
    name = name.rstrip(".")
    return name if _HOST.fullmatch(name) else None


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
