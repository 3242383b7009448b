"""Structured logging: the package's loggers, and a formatter that prints their fields."""

from __future__ import annotations

import json
import logging
from typing import IO, Any

__all__ = ["LOGGERS", "StructuredFormatter", "configure_logging"]

LOGGERS = ("atomr_accel.actor", "atomr_accel.device", "atomr_accel.telemetry")
"""One logger per layer, all under ``atomr_accel``.

``atomr_accel.device`` logs ``context_ready`` (INFO), ``context_down``
(WARNING), ``device_stopped`` (ERROR) and ``out_of_memory`` (WARNING), each
with the fields ``event``, ``device``, ``device_id`` and more (``generation``,
``restarts``, ``status``, ``requested``, ``available``) as record attributes.
"""

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message",
                                                                             "asctime"}


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call passed through ``extra=`` (not the private ones,
    ``_name``, that other libraries' record factories add to every record: Ray's
    ``_ray_timestamp_ns``, say)."""
    return {k: v for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")}


class StructuredFormatter(logging.Formatter):
    """Formats a record as ``time level logger message key=value ...`` or, with
    ``json=True``, as one JSON object per line holding the same fields."""

    def __init__(self, *, json: bool = False) -> None:
        super().__init__()
        self.json = json

    def format(self, record: logging.LogRecord) -> str:
        """Return the record and its ``extra=`` fields as one line (plus any traceback)."""
        fields = _fields_of(record)
        message = record.getMessage()
        if self.json:
            payload = {"time": record.created, "level": record.levelname,
                       "logger": record.name, "message": message, **fields}
            if record.exc_info:
                payload["exception"] = self.formatException(record.exc_info)
            return json.dumps(payload, default=str)
        extras = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{self.formatTime(record)} {record.levelname} {record.name} {message}"
        if extras:
            line = f"{line} {extras}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure_logging`` installs (so a second call can replace it)."""


def configure_logging(level: int | str = logging.INFO, *, stream: IO[str] | None = None,
                      json: bool = False) -> logging.Handler:
    """Send the ``atomr_accel`` loggers at ``level`` and above to ``stream`` (stderr).

    Records are formatted by ``StructuredFormatter`` (``json=True`` for JSON
    lines). Returns the handler; ``logging.getLogger("atomr_accel").removeHandler``
    undoes it. Calling it again replaces the previous handler.
    """
    logger = logging.getLogger("atomr_accel")
    for old in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(old)
    handler = _Handler(stream)
    handler.setFormatter(StructuredFormatter(json=json))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler
