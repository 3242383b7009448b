"""Plain-text output for the CLI: aligned tables and a progress line for long steps."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import IO, Any

__all__ = ["Progress", "format_bytes", "format_table"]


def format_bytes(value: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; None -> ``"-"``."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(abs(size), 1) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  "
                 ) -> str:
    """Return ``rows`` under ``columns`` as left-aligned text, one line per row."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) if cells else len(col)
              for i, col in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(indent + line.rstrip() for line in lines)


class Progress:
    """One numbered step: ``with Progress(out, 2, 7, "gemm") as step: ...; step.done(text)``.

    Prints ``[2/7] gemm ...`` at once; on a terminal it also counts the seconds
    while the step runs. On exit it completes the line with ``ok`` (or the
    error that ended the step) and the time taken; ``result`` keeps the text
    given to ``done`` for a summary.
    """

    def __init__(self, out: IO[str], index: int, total: int, label: str) -> None:
        self.out = out
        self.head = f"[{index}/{total}] {label} ..."
        self.result = ""
        self.seconds = 0.0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def done(self, result: str) -> None:
        """Say what the step achieved (printed when it ends)."""
        self.result = result

    def __enter__(self) -> Progress:
        self._start = time.perf_counter()
        self.out.write(self.head)
        self.out.flush()
        if self.out.isatty():
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            self.out.write(f"\r{self.head} {time.perf_counter() - self._start:.1f} s")
            self.out.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.seconds = time.perf_counter() - self._start
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self.out.write(f"\r\x1b[K{self.head}")  # clear the seconds counted
        text = "ok" if exc is None else f"FAILED: {exc!r}"
        self.out.write(f" {text} ({self.seconds:.2f} s)\n")
        self.out.flush()
