"""The original package's BLAS methods (``gemm_f32``, ``axpy_f64``, ``Device.sgemm``, ...),
attached to the BLAS ops: its argument order, its ``"N"``/``"T"``/``"C"`` and ``"U"``/``"L"``
option strings, ``n=None`` for whole vectors and its default timeouts."""

from __future__ import annotations

from atomr_accel.core._api import Form, Param, attach
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import Op
from atomr_accel.core.ops._blas import (
    Asum,
    Axpy,
    Copy,
    Dot,
    Geam,
    Gemm,
    GemmStridedBatched,
    Gemv,
    Ger,
    Iamax,
    Iamin,
    Nrm2,
    Rot,
    Scal,
    Swap,
    Syrk,
    Trsm,
)
from atomr_accel.original._options import diag_flag, side_flag, trans_flag
from atomr_accel.original._options import original as _original
from atomr_accel.original._options import trans_param as _trans
from atomr_accel.original._options import uplo_param as _uplo
from atomr_accel.original._options import whole_vectors as _whole

__all__: list[str] = []


def _level1(op: type[Op], vectors: tuple[str, ...], *, before: tuple[str, ...] = (),
            after: tuple[str, ...] = (), returns: str = "None") -> None:
    """A level-1 op's ``name_f32/_f64(*before, *vectors, *after, n=None, incx=1, ...)``."""
    name = op.api[0].name
    incs = tuple(f"inc{v}" for v in vectors)
    attach(op, _original(name, (*before, *vectors, *after, _whole(*vectors), *incs), 10.0,
                         returns))


_level1(Axpy, ("x", "y"), before=("alpha",))
_level1(Dot, ("x", "y"), returns="float")
_level1(Nrm2, ("x",), returns="float")
_level1(Scal, ("x",), before=("alpha",))
_level1(Asum, ("x",), returns="float")
_level1(Iamax, ("x",), returns="int")
_level1(Iamin, ("x",), returns="int")
_level1(Rot, ("x", "y"), after=("c", "s"))
_level1(Swap, ("x", "y"))
_level1(Copy, ("x", "y"))

attach(Gemm,
       _original("gemm", ("a", "b", "c", "m", "n", "k", "alpha", "beta",
                          _trans("trans_a", "conj_a"), _trans("trans_b", "conj_b"), "lda", "ldb",
                          "ldc"), 60.0),
       Form("sgemm", ("a", "b", "c", "m", "n", "k", "alpha", "beta"), handle="device",
            dtypes=(DType.F32,), timeout=60.0, suffixed=False,
            note="The original package's ``Device.sgemm``: float32, column-major."))
attach(GemmStridedBatched, _original("gemm_strided_batched", (
    "a", "b", "c", "m", "n", "k", Param("stride_a"), Param("stride_b"), Param("stride_c"),
    Param("batch_count", to=("batch",)), "alpha", "beta", _trans("trans_a", "conj_a"),
    _trans("trans_b", "conj_b"), "lda", "ldb", "ldc"), 60.0))
attach(Gemv, _original("gemv", ("a", "x", "y", "m", "n", "alpha", "beta", _trans("trans", "conj"),
                                "lda", "incx", "incy"), 30.0))
attach(Ger, _original("ger", ("x", "y", "a", "m", "n", "alpha", "lda", "incx", "incy"), 30.0))
attach(Geam, _original("geam", ("a", "b", "c", "m", "n", "alpha", Param("beta", 1.0),
                                _trans("trans_a", "conj_a"), _trans("trans_b", "conj_b"), "lda",
                                "ldb", "ldc"), 30.0))
attach(Syrk, _original("syrk", ("a", "c", "n", "k", "alpha", "beta", _uplo("L"),
                                Param("trans", "N", parse=trans_flag, annotation="str | bool"),
                                "lda", "ldc"), 30.0))
attach(Trsm, _original("trsm", ("a", "b", "m", "n", "alpha",
                                Param("side", "L", to=("left",), parse=side_flag, annotation="str"),
                                _uplo("L"), _trans("trans", "conj"),
                                Param("diag", "N", to=("unit_diag",), parse=diag_flag,
                                      annotation="str"), "lda", "ldb"), 30.0))
