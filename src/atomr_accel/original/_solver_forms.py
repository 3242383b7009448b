"""The original package's dense solver methods (``lu_f32``, ``cholesky_f64(a, n, uplo="U")``, ...),
attached to the solver ops."""

from __future__ import annotations

from atomr_accel.core._api import Param, attach
from atomr_accel.core.ops._solver import (
    Geqrf,
    Gesvd,
    GesvdjBatched,
    Getrf,
    GetrfBatched,
    Getrs,
    Potrf,
    PotrfBatched,
    Syevd,
)
from atomr_accel.original._options import original, uplo_param

__all__: list[str] = []

_BATCH = Param("batch_count", to=("batch",))
"""The original's ``batch_count`` as the op's ``batch``."""

attach(Getrf, original("lu", ("a", "ipiv", "m", "n", "lda"), 60.0))
attach(Getrs, original("lu_solve", (Param("lu", to=("a",)), "ipiv", "b", "n", "nrhs", "ldb",
                                    "trans"), 60.0))
attach(Potrf, original("cholesky", ("a", "n", uplo_param("U"), "lda"), 60.0))
attach(Geqrf, original("qr", ("a", "tau", "m", "n", "lda"), 60.0))
attach(Gesvd, original("svd", ("a", "s", "m", "n", Param("u", None), Param("vt", None)), 60.0))
attach(Syevd, original("eigh", ("a", "w", "n", uplo_param("L"), "lda",
                                Param("compute_vectors", True, to=("vectors",))), 60.0))
attach(GetrfBatched, original("getrf_batched", ("a", "ipiv", Param("info"), _BATCH, "n", "lda"),
                              60.0))
attach(PotrfBatched, original("potrf_batched", ("a", Param("info"), _BATCH, "n", uplo_param("U"),
                                                "lda"), 60.0))
attach(GesvdjBatched, original("gesvdj_batched", ("a", "s", _BATCH, "m", "n", Param("u", None),
                                                  Param("v", None)), 60.0))
