"""The ContextHost seam: where a device context lives and how ops reach it."""

from __future__ import annotations

import abc
import asyncio
import pickle
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atomr_accel.backends._base import Backend
from atomr_accel.core._errors import DeviceUnavailable, GpuRuntimeError, LibraryError
from atomr_accel.core._op import Op

__all__ = ["BackendSpec", "ContextHost", "translate_error"]


@dataclass(frozen=True)
class BackendSpec:
    """Which backend to build for a context, and its options; picklable."""

    name: str
    device_id: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def create(self) -> Backend:
        """Build the backend (imports it lazily); ``DeviceUnavailable`` if it cannot run here."""
        if self.name == "cpu":
            from atomr_accel.backends.cpu import CpuBackend

            return CpuBackend(self.device_id, **self.options)
        if self.name == "cuda":
            try:
                from atomr_accel.backends.cuda import CudaBackend
            except ImportError as exc:
                raise DeviceUnavailable(
                    "the CUDA backend needs CuPy: pip install 'atomr-accel[cuda]'"
                ) from exc
            backend: Backend = CudaBackend(self.device_id, **self.options)
            return backend
        raise DeviceUnavailable(f"unknown backend {self.name!r}; choose 'cpu' or 'cuda'")


def translate_error(exc: BaseException, op: Op) -> GpuRuntimeError:
    """Map what a backend raised to the taxonomy; foreign errors become ``LibraryError``."""
    if isinstance(exc, GpuRuntimeError):
        return exc
    error = LibraryError(op.library, type(exc).__name__, str(exc))
    error.__cause__ = exc
    return error


def picklable(error: GpuRuntimeError) -> GpuRuntimeError:
    """``error`` if it pickles, else a plain ``GpuRuntimeError`` with its text."""
    try:
        pickle.dumps(error)
    except Exception:
        return GpuRuntimeError(f"{type(error).__name__}: {error}")
    return error


class ContextHost(abc.ABC):
    """Runs ops against one device context and completes a future per op.

    All methods are called on the event loop that owns the host. ``died``
    resolves (with the error) if the context is lost on its own, e.g. when a
    worker process is killed; the owner then rebuilds.
    """

    kind: ClassVar[str]

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.died: asyncio.Future[GpuRuntimeError] | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Build the context; raises ``DeviceUnavailable`` when it cannot."""

    @abc.abstractmethod
    def submit(self, op: Op, stream: int = 0) -> asyncio.Future[Any]:
        """Queue ``op`` on ``stream``; the future completes with its result or a typed error."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the context; ops still queued fail with ``ContextPoisoned``."""

    @property
    @abc.abstractmethod
    def pid(self) -> int | None:
        """The process the context lives in (None before start)."""

    @property
    @abc.abstractmethod
    def in_flight(self) -> int:
        """Ops submitted and not yet completed."""

    def _mark_died(self, error: GpuRuntimeError) -> None:
        if self.died is not None and not self.died.done():
            self.died.set_result(error)


def settle(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Complete ``fut`` unless someone already did (or cancelled it)."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
