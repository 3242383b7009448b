"""CUB-shaped selection: select and partition by flags or a predicate, unique and run-length
encoding; the conventions are ``_cub``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form, Param
from atomr_accel.core._cexpr import parse
from atomr_accel.core._op import (
    require,
    require_buffer,
    require_len,
    require_shared_dtype,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._cub_common import (
    _N,
    _PREDICATE,
    ARITHMETIC,
    COUNTS,
    INTEGERS,
    _count,
    _CubOp,
    _distinct,
)

__all__ = [
    "CubRunLengthEncode",
    "CubSelect",
    "CubUnique",
]


class _Selection(_CubOp):
    """The ops that pick items of ``input``: the items they consider and the checks of
    ``input`` and of the output its items go to."""

    __slots__ = ()
    input: GpuRef
    n: int | None

    @property
    def items(self) -> int:
        """Items considered."""
        return self.input.length if self.n is None else self.n

    def _check_output(self, name: str) -> int:
        """Check ``input`` and the field ``name`` its items go to; answer the items."""
        out = getattr(self, name)
        require_shared_dtype(ARITHMETIC, **{"input": self.input, name: out})
        n = _count(self.n, self.input, "input")
        require_len(out, n, name)
        _distinct(self.input, out, f"input and {name}")
        return n


def _require_count(ref: GpuRef, name: str) -> None:
    """Check a one-item count of ``COUNTS``' dtypes."""
    require_buffer(ref, COUNTS, 1, name)


def _select_forms(partition: bool, *, flagged: str, by_predicate: str) -> tuple[Form, Form]:
    """The forms of select (or ``partition``) by flags and by a predicate, documented by
    ``flagged`` and ``by_predicate``."""
    kind = "partition" if partition else "select"
    return (
        Form(f"{kind}_flagged", ("input", Param("flags", annotation="BufferLike"), "output",
                                 "count", _N), fixed={"predicate": "", "partition": partition},
             doc=flagged),
        Form(f"{kind}_if", ("input", "output", "count", _PREDICATE, _N),
             fixed={"flags": None, "partition": partition}, doc=by_predicate),
    )


@dataclass(frozen=True, slots=True)
class CubSelect(_Selection):
    """Select (or partition) the first ``n`` items of ``input`` by ``flags`` or ``predicate``.

    An item is selected where ``flags`` (an integer buffer) is non-zero, or where
    ``predicate``, a small C expression over ``x`` (``core._cexpr``), holds: give
    exactly one. Select writes the selected items in order to the front of
    ``output``; partition (``partition=True``) also writes the others after them
    in reverse order, as CUB does. ``count[0]`` gets the number selected.
    ``output`` holds at least ``n`` items and is not ``input``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("output", "count")
    api = (
        *_select_forms(False, flagged="Copy the items whose flag is non-zero, in order, to "
                                      "``output``; their number to ``count[0]``.",
                       by_predicate="Copy the items for which the C expression ``predicate`` "
                                    "over ``x`` holds, in order, to ``output``; their number "
                                    "to ``count[0]``."),
        *_select_forms(True, flagged="Flagged items first (in order), the rest after them "
                                     "(reversed); the number flagged to ``count[0]``.",
                       by_predicate="Items for which ``predicate`` holds first (in order), the "
                                    "rest after them (reversed); their number to "
                                    "``count[0]``."),
    )
    input: GpuRef
    output: GpuRef
    count: GpuRef
    n: int | None = None
    flags: GpuRef | None = None
    predicate: str = ""
    partition: bool = False

    def validate(self) -> None:
        n = self._check_output("output")
        _require_count(self.count, "count")
        require((self.flags is None) != (self.predicate == ""),
                "give either flags or a predicate, not both or neither")
        if self.flags is not None:
            require_buffer(self.flags, (*INTEGERS,), n, "flags")
        else:
            parse(self.predicate, ("x",))


@dataclass(frozen=True, slots=True)
class CubUnique(_Selection):
    """Keep the first item of each run of equal consecutive items of ``input`` (CUB's
    ``DeviceSelect::Unique``: sorted input gives the distinct values), in order, in
    ``output``; their number in ``count[0]``. NaNs never equal each other, so each is kept.
    """

    outputs: ClassVar[tuple[str, ...]] = ("output", "count")
    api = (Form("unique", ("input", "output", "count", _N)),)
    input: GpuRef
    output: GpuRef
    count: GpuRef
    n: int | None = None

    def validate(self) -> None:
        self._check_output("output")
        _require_count(self.count, "count")


@dataclass(frozen=True, slots=True)
class CubRunLengthEncode(_Selection):
    """Run-length encode the first ``n`` items of ``input``: each run of equal consecutive
    items gives its value in ``unique_out`` and its length in ``counts_out``, in order;
    ``num_runs[0]`` gets the number of runs. NaNs never equal each other (runs of 1)."""

    outputs: ClassVar[tuple[str, ...]] = ("unique_out", "counts_out", "num_runs")
    api = (Form("run_length_encode", ("input", "unique_out", "counts_out", "num_runs", _N)),)
    input: GpuRef
    unique_out: GpuRef
    counts_out: GpuRef
    num_runs: GpuRef
    n: int | None = None

    def validate(self) -> None:
        n = self._check_output("unique_out")
        require_buffer(self.counts_out, COUNTS, n, "counts_out")
        _require_count(self.num_runs, "num_runs")
