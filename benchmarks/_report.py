"""Shared helpers for benchmark scripts: percentiles, a text table, JSON output, `--quick`
and the skip of GPU-only benchmarks where no GPU is visible."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``samples`` (nearest rank)."""
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summarize_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50/p99/mean of nanosecond samples, in microseconds."""
    us = [s / 1000 for s in samples_ns]
    return {"p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "mean_us": statistics.fmean(us)}


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """Print rows under a title as an aligned text table."""
    cells = [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) for i, col in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(col.ljust(w) for col, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` plus machine facts as JSON to ``path``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        **payload,
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {out}")


def wall_samples(fn: Callable[[], Any], reps: int, warm: int) -> list[float]:
    """Wall seconds of each of ``reps`` calls of a blocking ``fn``, after ``warm`` calls."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


async def samples_ns_async(make: Callable[[], Awaitable[Any]], reps: int,
                           warm: int = 200) -> list[int]:
    """Wall nanoseconds of each of ``reps`` awaited calls of ``make()``, after ``warm``
    untimed ones, on the running loop."""
    for _ in range(warm):
        await make()
    out = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        await make()
        out.append(time.perf_counter_ns() - start)
    return out


def pipelined(make: Callable[[], Coroutine[Any, Any, Any]], inflight: int, reps: int,
              warm: int) -> list[float]:
    """Wall seconds per call of batches of ``inflight`` gathered async calls."""
    async def batches() -> list[float]:
        async def batch() -> None:
            await asyncio.gather(*(make() for _ in range(inflight)))
        for _ in range(warm):
            await batch()
        out = []
        for _ in range(reps):
            start = time.perf_counter()
            await batch()
            out.append((time.perf_counter() - start) / inflight)
        return out
    return asyncio.run(batches())


def cupy_event_samples(fn: Callable[[], Any], reps: int, warm: int) -> list[float]:
    """Seconds of each of ``reps`` back-to-back calls of ``fn`` on CuPy's current stream, by
    CUDA events around each (one synchronize at the end; needs CuPy and a GPU)."""
    import cupy as cp

    for _ in range(warm):
        fn()
    marks = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
    for start, end in marks:
        start.record()
        fn()
        end.record()
    marks[-1][1].synchronize()
    return [float(cp.cuda.get_elapsed_time(s, e)) / 1e3 for s, e in marks]


class _Quick(argparse.Action):
    """``--quick``: set ``quick`` and each small value; options given after it still win."""

    def __init__(self, option_strings: Sequence[str], dest: str,
                 small: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.small = small or {}
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)
        for name, value in self.small.items():
            setattr(namespace, name, value)


def add_quick(parser: argparse.ArgumentParser, **small: Any) -> None:
    """Give a benchmark ``--quick`` (what ``atomr-accel bench --quick`` passes): a smoke run
    at small sizes and few iterations, ``small`` mapping option names (their ``dest``) to
    the values it sets. Options given after ``--quick`` override them."""
    shown = ", ".join(f"{name}={value}" for name, value in small.items())
    parser.add_argument("--quick", action=_Quick, small=small,
                        help=f"a smoke run at small sizes ({shown})")


def require_cuda(what: str = "a CUDA device") -> None:
    """Exit with ``SKIP_STATUS`` after one line when no CUDA device is visible: how a
    GPU-only benchmark says it cannot run here (``atomr-accel bench`` reports it skipped)."""
    from atomr_accel.backends import cuda_device_count
    from atomr_accel.cli import SKIP_STATUS

    if cuda_device_count() == 0:
        print(f"skipped: needs {what}, and none is visible")
        raise SystemExit(SKIP_STATUS)


def has_cuda() -> bool:
    """Whether a CUDA device is visible (for benchmarks with CPU rows to fall back on)."""
    from atomr_accel.backends import cuda_device_count

    return cuda_device_count() > 0


def quiet_expected_faults() -> None:
    """Keep the package's log (a traceback per actor failure) off the output of a benchmark
    that injects faults on purpose and counts every error itself."""
    logging.getLogger("atomr_accel").setLevel(logging.CRITICAL)
