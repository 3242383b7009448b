"""Where a request's answer goes, and who else hears of the requests a device hands to its
context."""

from __future__ import annotations

from typing import Any, Protocol

from atomr_accel.core._op import Op

__all__ = ["Answer", "LaunchObserver", "OpObserver"]


class Answer(Protocol):
    """Where a request's answer goes: an ask's ``Reply``, or a blocking caller's slot."""

    def set_result(self, value: Any) -> None:
        """Answer with ``value``."""

    def set_exception(self, exc: BaseException) -> None:
        """Answer with ``exc``."""


class OpObserver(Protocol):
    """Told about every request a device hands to its context (``DeviceState.add_observer``).

    Both calls run inside the op path, on the thread that made or finished the
    request (the system's event loop, a blocking caller's thread or a
    completion thread): keep them short and thread-safe. An exception they
    raise is logged and otherwise ignored. Requests refused before they reach a
    context (bad input, a full rebuild queue, a stopped device) are not reported.
    """

    def op_started(self, device: str, op: Op) -> None:
        """A request for ``op`` is on its way to the context of ``device``."""

    def op_finished(self, device: str, op: Op, seconds: float,
                    error: BaseException | None) -> None:
        """It was answered after ``seconds``: with a result (``error`` None) or ``error``."""


class LaunchObserver(OpObserver, Protocol):
    """An ``OpObserver`` also told when each request is launched on a context (the moment
    its host claims it; again on the next context when it runs again there). Any
    observer with an ``op_launched`` method is told, on the launching thread."""

    def op_launched(self, device: str, op: Op, generation: int) -> None:
        """The request for ``op`` was handed to context ``generation`` of ``device``."""
