"""The original package's ``atomr_accel.blas``: ``Blas``."""

from atomr_accel.facade._libraries import Blas

__all__ = ["Blas"]
