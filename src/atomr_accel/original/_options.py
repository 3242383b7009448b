"""The original package's option strings and form shapes, as ``Param``s and ``Form``s.

Its ``"N"``/``"T"``/``"C"``, ``"U"``/``"L"``, ``"L"``/``"R"`` and ``"N"``/``"U"``
options, its ``n=None`` for whole vectors and its ``name_f32`` / ``name_f64``
methods with ``timeout_secs`` last: what the ``*_forms`` modules attach to the ops.
"""

from __future__ import annotations

from typing import Any

from atomr_accel.core._api import Form, Param, choice
from atomr_accel.core._dtype import DType

__all__ = [
    "REALS",
    "diag_flag",
    "original",
    "side_flag",
    "trans_flag",
    "trans_flags",
    "trans_param",
    "uplo_flag",
    "uplo_param",
    "vector_count",
    "whole_vectors",
]


trans_flags = choice("trans", {"n": (False, False), "t": (True, False), "c": (True, True),
                               False: (False, False), True: (True, False)})
"""``"N"``/``"T"``/``"C"`` (or a bool) as ``(trans, conj)``."""

trans_flag = choice("trans", {"n": False, "t": True, False: False, True: True})
"""``"N"``/``"T"`` (or a bool) as ``trans``, for ops with no conjugate."""

uplo_flag = choice("uplo", {"u": True, "upper": True, "l": False, "lower": False})
"""``"U"``/``"L"`` as ``upper``."""

side_flag = choice("side", {"l": True, "left": True, "r": False, "right": False})
"""``"L"``/``"R"`` as ``left``."""

diag_flag = choice("diag", {"n": False, "u": True})
"""``"N"``/``"U"`` as ``unit_diag``."""


def vector_count(*vectors: Any) -> int:
    """The ``n`` that covers every vector: pairs ``(ref, inc)`` flattened as
    ``ref1, inc1, ref2, inc2``; a vector of ``L`` elements ``|inc|`` apart holds
    ``(L - 1) // |inc| + 1`` of them."""
    counts = []
    for ref, inc in zip(vectors[::2], vectors[1::2], strict=True):
        step = abs(inc) if isinstance(inc, int) and inc != 0 else 1
        counts.append(0 if ref.length == 0 else (ref.length - 1) // step + 1)
    return min(counts)


REALS = (DType.F32, DType.F64)
"""The dtypes of the original package's ``_f32`` / ``_f64`` methods."""


def original(name: str, params: tuple[str | Param, ...], timeout: float,
             returns: str = "None", dtypes: tuple[DType, ...] = REALS) -> Form:
    """The original package's ``name_f32`` / ``name_f64`` form of an op."""
    return Form(name, params, dtypes=dtypes, timeout=timeout, returns=returns,
                note="The original package's form.", timeout_last=True)


def whole_vectors(*vectors: str) -> Param:
    """The original's ``n=None``: as many elements as every vector holds."""
    uses = tuple(name for v in vectors for name in (v, f"inc{v}"))
    return Param("n", None, fill=vector_count, uses=uses, annotation="int | None")


def trans_param(name: str, conj: str) -> Param:
    """The original's ``"N"``/``"T"``/``"C"`` option as an op's transpose and conjugate."""
    return Param(name, "N", to=(name, conj), parse=trans_flags, annotation="str | bool")


def uplo_param(default: str) -> Param:
    """The original's ``uplo="U"``/``"L"`` as an op's ``upper``."""
    return Param("uplo", default, to=("upper",), parse=uplo_flag, annotation="str")
