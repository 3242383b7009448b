"""Chrome trace-event JSON (what Perfetto and chrome://tracing open) of CUPTI records and
op spans, on one timeline.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.telemetry._ops_trace import OpSpan

__all__ = ["chrome_trace", "write_chrome_trace"]

_HOST_PID = 1
_GPU_PID = 100  # + the CUDA device index
_ORDER = {"M": 0, "b": 1, "X": 2, "n": 3, "e": 4}


def _us(ns: int, origin: int) -> float:
    return (ns - origin) / 1000.0


def _span_events(spans: list[OpSpan], origin: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    tracks = {name: i + 1 for i, name in enumerate(sorted({s.device for s in spans}))}
    for device, tid in tracks.items():
        events.append({"ph": "M", "name": "thread_name", "pid": _HOST_PID, "tid": tid,
                       "args": {"name": f"ops of {device}"}})
    for number, span in enumerate(spans):
        name = f"{span.library}.{span.op}"
        common = {"cat": "atomr.op", "id": f"0x{number:x}", "pid": _HOST_PID,
                  "tid": tracks[span.device], "name": name}
        args = {"device": span.device, "library": span.library, "op": span.op,
                "outcome": span.outcome, "generation": span.generation}
        events.append({**common, "ph": "b", "ts": _us(span.submitted_ns, origin),
                       "args": args})
        if span.launched_ns is not None:
            events.append({**common, "ph": "n", "name": "launched",
                           "ts": _us(span.launched_ns, origin),
                           "args": {"op": name, "generation": span.generation}})
        events.append({**common, "ph": "e", "ts": _us(span.completed_ns, origin),
                       "args": {"outcome": span.outcome}})
    return events


def _record_events(records: list[Mapping[str, Any]], origin: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    named: set[tuple[int, int]] = set()
    for record in records:
        device = record.get("device")
        if device is not None:  # GPU work: one process per GPU, one thread per stream
            pid, tid = _GPU_PID + int(device), int(record.get("stream") or 0)
            label = (pid, 0)
            if label not in named:
                named.add(label)
                events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                               "args": {"name": f"GPU {device}"}})
            if (pid, tid) not in named:
                named.add((pid, tid))
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"stream {tid}"}})
        else:  # API calls and ranges: on the host, by thread
            pid, tid = _HOST_PID, int(record.get("thread") or 0)
        args = {k: v for k, v in record.items()
                if k not in ("kind", "name", "start_ns", "end_ns") and v is not None}
        start, end = int(record["start_ns"]), int(record["end_ns"])
        events.append({"ph": "X", "cat": f"cupti.{record['kind']}", "name": str(record["name"]),
                       "pid": pid, "tid": tid, "ts": _us(start, origin),
                       "dur": max(0.0, (end - start) / 1000.0), "args": args})
    return events


def chrome_trace(records: Iterable[Mapping[str, Any]] = (),
                 spans: Iterable[OpSpan] = ()) -> dict[str, Any]:
    """The Chrome trace-event document of CUPTI ``records`` (``CuptiSession.drain()``) and
    op ``spans`` (``OpTracer.spans``), both on the ``time.perf_counter_ns()`` clock.

    Ops are async slices (``b``/``e``, one per op, from submission to answer,
    with a ``launched`` instant between) on a host track per device; kernels
    and copies are complete slices (``X``) in a process per GPU, a thread per
    stream; API calls and NVTX ranges in the host process. Times are in µs
    from the earliest event; events are sorted by time.
    """
    recs = list(records)
    ops = list(spans)
    for record in recs:
        missing = {"kind", "name", "start_ns", "end_ns"} - set(record)
        if missing:
            raise InvalidArgument(f"a CUPTI record lacks {sorted(missing)}: {record!r}")
    for span in ops:
        if not isinstance(span, OpSpan):
            raise InvalidArgument(f"spans must be OpSpan objects, got {span!r}")
    starts = [int(r["start_ns"]) for r in recs] + [s.submitted_ns for s in ops]
    origin = min(starts, default=0)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": _HOST_PID, "tid": 0,
               "args": {"name": "atomr-accel host"}}]
    events += _span_events(ops, origin) + _record_events(recs, origin)
    events.sort(key=lambda e: (e.get("ts", -1.0), _ORDER[e["ph"]]))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"generator": "atomr-accel", "origin_perf_counter_ns": origin}}


def write_chrome_trace(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]] = (),
                       spans: Iterable[OpSpan] = ()) -> Path:
    """Write ``chrome_trace(records, spans)`` as JSON to ``path`` (open it in
    https://ui.perfetto.dev or chrome://tracing); return the path."""
    document = chrome_trace(records, spans)
    out = Path(path)
    out.write_text(json.dumps(document))
    return out
