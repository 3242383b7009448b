"""Device-wide primitives: the ``Cub`` handle (``dev.cub()``) and its operator choices."""

from atomr_accel.core.ops._cub import ReduceKind, ScanKind
from atomr_accel.facade._cub import Cub

__all__ = ["Cub", "ReduceKind", "ScanKind"]
