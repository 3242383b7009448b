"""CuptiSession: CUPTI activity tracing (kernels, copies, API calls, NVTX ranges) through
``cupti-python``, as plain records on the host clock our op spans use.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

from atomr_accel.backends._optional import require
from atomr_accel.core._errors import (
    AskTimeout,
    InvalidArgument,
    LibraryError,
    LibraryUnavailable,
)

__all__ = ["CATEGORIES", "DEFAULT_CATEGORIES", "CuptiSession"]

_log = logging.getLogger("atomr_accel.telemetry")

T = TypeVar("T")

CATEGORIES: dict[str, tuple[str, ...]] = {
    "kernel": ("CONCURRENT_KERNEL",),
    "kernel_launch": ("DRIVER", "RUNTIME"),
    "memcpy": ("MEMCPY",),
    "driver": ("DRIVER",),
    "driver_api": ("DRIVER",),
    "runtime": ("RUNTIME",),
    "runtime_api": ("RUNTIME",),
    "range": ("MARKER",),
    "range_profiler": (),
}
"""The original's category names -> the CUPTI activity kinds they enable. ``kernel_launch``
keeps only the launch calls of the driver and runtime APIs; ``range`` is NVTX ranges
(``NvtxKernelTrace``); ``range_profiler`` (CUPTI's range profiler, a metrics API) is named
but refused with ``LibraryError``: cupti-python does not offer it."""

DEFAULT_CATEGORIES = ("kernel", "memcpy")
"""What ``start()`` traces when no categories are given."""

_FLUSH_FORCED = 1
_BUFFER_BYTES = 8 << 20
_lock = threading.Lock()
_active: CuptiSession | None = None  # the session tracing now
_receiver: CuptiSession | None = None  # the last session started: late records go there
_registered = False


def _cupti() -> ModuleType:
    """The ``cupti.cupti`` bindings, or ``LibraryUnavailable`` naming cupti-python."""
    return require("cupti")


def _bounded(call: Callable[[], T], timeout: float, what: str) -> T:
    """Run ``call`` on a helper thread and wait at most ``timeout`` seconds for it (a CUPTI
    flush waits for the GPU); ``AskTimeout`` if it takes longer (it then ends by itself)."""
    outcome: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:
            outcome.append((False, exc))
        done.set()

    threading.Thread(target=run, name=f"atomr-cupti-{what}", daemon=True).start()
    if not done.wait(timeout):
        raise AskTimeout(f"cupti {what}", timeout)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _positive(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:
        raise InvalidArgument(f"timeout_secs must be a finite number > 0, got {value!r}")
    return float(value)


def _categories(categories: str | Iterable[str] | None) -> tuple[str, ...]:
    if categories is None:
        return DEFAULT_CATEGORIES
    names = (categories,) if isinstance(categories, str) else tuple(categories)
    if not names:
        raise InvalidArgument("categories must name at least one category (or be None)")
    for name in names:
        if not isinstance(name, str) or name not in CATEGORIES:
            raise InvalidArgument(f"unknown CUPTI category {name!r}; "
                                  f"choose from {', '.join(CATEGORIES)}")
    if "range_profiler" in names:
        raise LibraryError("cupti", "unsupported",
                           "range_profiler is CUPTI's range profiler (metrics), which "
                           "cupti-python does not offer; trace NVTX ranges with 'range'")
    return tuple(dict.fromkeys(names))


def _wrapped(cupti: ModuleType, call: Callable[[], T]) -> T:
    """``call()``, its CUPTI errors as ``LibraryError`` and a missing libcupti as
    ``LibraryUnavailable``."""
    try:
        return call()
    except cupti.cuptiError as exc:
        raise LibraryError("cupti", _status(cupti, exc), str(exc)) from exc
    except (OSError, RuntimeError) as exc:  # libcupti missing or not loadable
        raise LibraryUnavailable("cupti", "cupti-python", "cupti",
                                 f"{type(exc).__name__}: {exc}") from exc


def _status(cupti: ModuleType, exc: Exception) -> str:
    status = getattr(exc, "status", None)
    try:
        return str(cupti.Result(status).name)
    except (ValueError, TypeError):
        return str(status)


def _clock_offset(cupti: ModuleType) -> int:
    """CUPTI's clock minus ``time.perf_counter_ns()``, in ns (median of a few readings)."""
    offsets = []
    for _ in range(9):
        before = time.perf_counter_ns()
        stamp = int(cupti.get_timestamp())
        after = time.perf_counter_ns()
        offsets.append(stamp - (before + after) // 2)
    return int(statistics.median(offsets))


def _loaded(library: str) -> str | None:
    """The path of the shared library ``library`` this process has loaded (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if os.path.basename(path).startswith(library):
                    return path
    except OSError:
        return None
    return None


def _route_nvtx_to_cupti() -> None:
    """Point NVTX at libcupti (``NVTX_INJECTION64_PATH``) so CUPTI sees NVTX ranges. NVTX
    reads it at its first call in the process: set before any range was pushed, it works;
    after, start the process with it set."""
    if "NVTX_INJECTION64_PATH" in os.environ:
        return
    path = _loaded("libcupti.so")
    if path is not None:
        os.environ["NVTX_INJECTION64_PATH"] = path


def _buffer_requested() -> tuple[int, int]:
    return _BUFFER_BYTES, 0


def _buffer_completed(activities: list[Any]) -> None:
    session = _receiver
    if session is None:
        return
    try:
        session._take(activities)
    except Exception:  # never raise into CUPTI's thread
        _log.exception("CUPTI activity records could not be read")


class CuptiSession:
    """CUPTI activity tracing for this process: ``start(categories)``, run work,
    ``stop()``, ``drain()`` -> records.

    Needs ``cupti-python`` (the ``cupti`` extra) and a libcupti that matches the
    driver; ``start`` raises ``LibraryUnavailable`` naming the package where
    they are missing. Categories (the original's names, see ``CATEGORIES``):
    ``kernel, kernel_launch, memcpy, driver, driver_api, runtime, runtime_api,
    range, range_profiler``; any other raises ``InvalidArgument``. One session
    traces at a time in a process (CUPTI's activity buffers are per process);
    it sees the work of this process, so trace thread-host devices
    (``isolation="thread"``), not worker processes. NVTX ranges (``range``)
    reach CUPTI through ``NVTX_INJECTION64_PATH``: ``start`` sets it to the
    loaded libcupti when unset, which takes effect if no NVTX range was pushed
    in the process before (NVTX reads it once); else set it before starting.

    A record is a dict: ``kind`` (``kernel``, ``memcpy``, ``driver``,
    ``runtime`` or ``range``), ``name`` (kernel name, copy direction, API call
    or range message), ``start_ns``/``end_ns`` on the ``time.perf_counter_ns()``
    clock (as ``OpSpan``), ``stream``, ``device``, ``bytes`` (copies; else
    None), ``correlation_id`` (ties a kernel to the API call that launched it),
    and ``thread`` for API calls. A kernel's record exists once it has run:
    synchronize the device before ``drain``.
    """

    def __init__(self) -> None:
        self._categories: tuple[str, ...] = ()
        self._kinds: list[Any] = []
        self._records: list[dict[str, Any]] = []
        self._markers: dict[int, tuple[str, int]] = {}
        self._offset = 0
        self._launches_only = False
        self._cupti: ModuleType | None = None
        self._records_lock = threading.Lock()

    @property
    def active(self) -> bool:
        """True between ``start`` and ``stop``."""
        return _active is self

    @property
    def categories(self) -> tuple[str, ...]:
        """The categories of the last ``start``."""
        return self._categories

    def start(self, categories: str | Iterable[str] | None = None,
              timeout_secs: float = 2.0) -> None:
        """Start tracing ``categories`` (default ``kernel`` and ``memcpy``).

        ``InvalidArgument`` for an unknown category or when a session is tracing
        already; ``LibraryUnavailable`` without cupti-python or libcupti;
        ``AskTimeout`` if CUPTI does not start within ``timeout_secs``.
        """
        global _active, _receiver
        names = _categories(categories)
        timeout = _positive(timeout_secs)
        cupti = _cupti()
        kinds = list(dict.fromkeys(
            cupti.ActivityKind[kind] for name in names for kind in CATEGORIES[name]))
        with _lock:
            if _active is not None:
                raise InvalidArgument("a CuptiSession is tracing in this process already; "
                                      "stop it first")

            def begin() -> int:
                global _registered
                if not _registered:
                    cupti.activity_register_callbacks(_buffer_requested, _buffer_completed)
                    _registered = True
                offset = _clock_offset(cupti)
                for kind in kinds:
                    cupti.activity_enable(kind)
                return offset

            self._cupti = cupti
            self._categories = names
            self._kinds = kinds
            self._launches_only = "kernel_launch" in names and not (
                {"driver", "driver_api", "runtime", "runtime_api"} & set(names))
            _receiver = self
            try:
                self._offset = _wrapped(cupti, lambda: _bounded(begin, timeout, "start"))
            except BaseException:
                for kind in kinds:
                    _disable(cupti, kind)
                raise
            _active = self
        if "range" in names:
            _route_nvtx_to_cupti()

    def stop(self, timeout_secs: float = 2.0) -> None:
        """Stop tracing; the records so far wait for ``drain``. A no-op when not tracing.
        ``AskTimeout`` if CUPTI's last records do not arrive within ``timeout_secs``."""
        global _active
        timeout = _positive(timeout_secs)
        with _lock:
            if _active is not self:
                return
            cupti = self._cupti
            assert cupti is not None
            _active = None
            for kind in self._kinds:
                _disable(cupti, kind)
            _wrapped(cupti, lambda: _bounded(
                lambda: cupti.activity_flush_all(_FLUSH_FORCED), timeout, "stop"))

    def drain(self, timeout_secs: float = 2.0) -> list[dict[str, Any]]:
        """Return the records gathered since the last ``drain``, oldest first, and forget
        them. While tracing, CUPTI's buffers are flushed first (``AskTimeout`` after
        ``timeout_secs``); a session never started has none: ``[]``."""
        timeout = _positive(timeout_secs)
        cupti = self._cupti
        if cupti is not None and self.active:
            _wrapped(cupti, lambda: _bounded(
                lambda: cupti.activity_flush_all(_FLUSH_FORCED), timeout, "drain"))
        with self._records_lock:
            records, self._records = self._records, []
        records.sort(key=lambda r: (r["start_ns"], r["end_ns"]))
        return records

    # ------------------------------------------------------------- CUPTI's thread

    def _take(self, activities: list[Any]) -> None:
        cupti = self._cupti
        assert cupti is not None
        kind = cupti.ActivityKind
        records = []
        for activity in activities:
            record = None
            if activity.kind in (kind.CONCURRENT_KERNEL, kind.KERNEL):
                record = self._record("kernel", str(activity.name), activity)
                record["stream"] = int(activity.stream_id)
                record["device"] = int(activity.device_id)
                record["grid"] = [activity.grid_x, activity.grid_y, activity.grid_z]
                record["block"] = [activity.block_x, activity.block_y, activity.block_z]
            elif activity.kind == kind.MEMCPY:
                direction = cupti.ActivityMemcpyKind(activity.copy_kind).name
                record = self._record("memcpy", f"memcpy {direction}", activity)
                record["stream"] = int(activity.stream_id)
                record["device"] = int(activity.device_id)
                record["bytes"] = int(activity.bytes)
            elif activity.kind in (kind.DRIVER, kind.RUNTIME):
                record = self._api(cupti, activity)
            elif activity.kind == kind.MARKER:
                record = self._marker(cupti, activity)
            if record is not None:
                records.append(record)
        with self._records_lock:
            self._records.extend(records)

    def _record(self, kind: str, name: str, activity: Any) -> dict[str, Any]:
        return {"kind": kind, "name": name,
                "start_ns": int(activity.start) - self._offset,
                "end_ns": int(activity.end) - self._offset,
                "stream": None, "device": None, "bytes": None,
                "correlation_id": int(activity.correlation_id)}

    def _api(self, cupti: ModuleType, activity: Any) -> dict[str, Any] | None:
        driver = activity.kind == cupti.ActivityKind.DRIVER
        domain = cupti.CallbackDomain.DRIVER_API if driver else cupti.CallbackDomain.RUNTIME_API
        name = str(cupti.get_callback_name(domain, activity.cbid))
        if self._launches_only and "Launch" not in name:
            return None
        record = self._record("driver" if driver else "runtime", name, activity)
        record["thread"] = int(activity.thread_id)
        return record

    def _marker(self, cupti: ModuleType, activity: Any) -> dict[str, Any] | None:
        flags = int(activity.flags_)
        stamp = int(activity.timestamp) - self._offset
        if flags & int(cupti.ActivityFlag.MARKER_START):
            self._markers[int(activity.id)] = (str(activity.name), stamp)
            return None
        if flags & int(cupti.ActivityFlag.MARKER_INSTANTANEOUS):
            name, begin = str(activity.name), stamp
        else:
            opened = self._markers.pop(int(activity.id), None)
            if opened is None:
                return None
            name, begin = opened
        return {"kind": "range", "name": name, "start_ns": begin, "end_ns": stamp,
                "stream": None, "device": None, "bytes": None, "correlation_id": None,
                "domain": str(activity.domain or "")}

    def __repr__(self) -> str:
        state = "tracing" if self.active else "idle"
        return f"CuptiSession({state}, categories={list(self._categories)})"


def _disable(cupti: ModuleType, kind: Any) -> None:
    try:
        cupti.activity_disable(kind)
    except Exception:
        _log.debug("CUPTI activity kind %s was not enabled", kind, exc_info=True)
