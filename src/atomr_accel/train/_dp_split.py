"""How a data-parallel step cuts its global batch: replica shares, micro-batches, and the
factors that make the summed gradient equal one device's on the whole batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atomr_accel.core._errors import DTypeMismatch, InvalidArgument
from atomr_accel.train._model import Array

__all__ = ["Share", "batch_arrays", "plan_shares", "require_width", "rows_array"]


@dataclass(frozen=True, slots=True)
class Share:
    """Rows ``start:stop`` of the global batch go to one replica, run as micro-batches of
    ``chunks`` (``(start, stop)`` pairs in global rows)."""

    start: int
    stop: int
    chunks: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> int:
        """How many rows the replica trains on."""
        return self.stop - self.start


def plan_shares(rows: int, replicas: int, micro_batch: int | None) -> list[Share]:
    """Split ``rows`` into ``replicas`` contiguous shares as even as possible (the first
    ``rows % replicas`` get one more row; a share may be empty when ``rows < replicas``),
    each cut into micro-batches of at most ``micro_batch`` rows (None: one)."""
    base, extra = divmod(rows, replicas)
    shares: list[Share] = []
    start = 0
    for index in range(replicas):
        stop = start + base + (1 if index < extra else 0)
        step = micro_batch or max(stop - start, 1)
        chunks = tuple((a, min(a + step, stop)) for a in range(start, stop, step))
        shares.append(Share(start, stop, chunks))
        start = stop
    return shares


def rows_array(x: object, *, finite: bool = True) -> Array:
    """``x`` as a NumPy array of numeric rows (2-D or more, at least one row), checked
    once, before anything runs (``InvalidArgument`` / ``DTypeMismatch``; ``finite``: NaN
    and infinities too)."""
    xs = _numeric("x", x, finite)
    if xs.ndim < 2:
        raise InvalidArgument(f"x must hold one row per sample (2-D or more), got shape "
                              f"{xs.shape}")
    if len(xs) == 0:
        raise InvalidArgument("x holds no rows")
    return xs


def batch_arrays(x: object, y: object, classes: bool, *, finite: bool = True,
                 ) -> tuple[Array, Array]:
    """``x`` as ``rows_array`` and ``y`` with one target per row (integer class labels
    when ``classes``, numbers otherwise), each checked once (``finite``: also for NaN and
    infinities, one pass over each)."""
    xs = rows_array(x, finite=finite)
    ys = _numeric("y", y, finite)
    if ys.ndim == 0 or len(ys) != len(xs):
        raise InvalidArgument(f"y must hold one target per row of x ({len(xs)}), got shape "
                              f"{ys.shape}")
    if classes and not np.issubdtype(ys.dtype, np.integer):
        raise DTypeMismatch(f"y must hold integer class labels for CrossEntropyLoss, got "
                            f"{ys.dtype}")
    return xs, ys


def require_width(xs: Array, features: int | None) -> None:
    """``InvalidArgument`` unless the rows of ``xs`` hold ``features`` numbers (None: any)."""
    width = int(np.prod(xs.shape[1:]))
    if features is not None and width != features:
        raise InvalidArgument(f"x rows hold {width} features, the model takes {features}")


def _numeric(name: str, value: object, finite: bool = True) -> Array:
    if isinstance(value, str | bytes):
        raise InvalidArgument(f"{name} must be a NumPy array or nested lists of numbers, "
                              f"got {type(value).__name__}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{name} must be a NumPy array or nested lists of numbers "
                              f"({exc})") from None
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                     or array.dtype == np.bool_):
        raise InvalidArgument(f"{name} must hold numbers, got dtype {array.dtype}")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DTypeMismatch(f"{name} must hold real numbers, got {array.dtype}")
    # One fast pass: a finite sum proves every value finite; only a sum that is not
    # finite (a NaN or an infinity, or finite values whose sum overflows) is checked
    # value by value.
    if (finite and np.issubdtype(array.dtype, np.floating) and array.size
            and not _all_finite(array)):
        raise InvalidArgument(f"{name} holds NaN or infinite values")
    return array


def _all_finite(array: Array) -> bool:
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(array.sum()):
            return True
    return bool(np.all(np.isfinite(array)))
