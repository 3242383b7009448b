"""Fault injection: an op that makes the context fail on purpose (tests, demo, chaos)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from atomr_accel.core._api import Form
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import Op

__all__ = ["FaultKind", "InjectFault"]


class FaultKind(enum.Enum):
    """Which failure to cause."""

    POISON = "poison"
    """A sticky context fault: ``ContextPoisoned`` (on CUDA, a real illegal-address kernel)."""
    OOM = "oom"
    """An allocation failure: ``OutOfMemory``; the context stays usable."""
    UNRECOVERABLE = "unrecoverable"
    """A fault the device cannot come back from: ``Unrecoverable``."""
    CRASH = "crash"
    """The context's process dies at once (SIGKILL); only meaningful on the process host."""

    __reduce_ex__ = pickle_by_name


@dataclass(frozen=True, slots=True)
class InjectFault(Op):
    """Make the context fail with ``kind``; ``delay`` seconds of work first (0 for none)."""

    api = (Form("inject_fault", ("kind", "delay"), handle="device",
                doc="Make the context fail on purpose (tests and demos); raises the fault's "
                "error."),)

    kind: FaultKind
    delay: float = 0.0

    def validate(self) -> None:
        if not isinstance(self.kind, FaultKind):
            raise InvalidArgument(f"kind must be a FaultKind, got {self.kind!r}")
        if not self.delay >= 0:
            raise InvalidArgument(f"delay must be >= 0, got {self.delay}")
