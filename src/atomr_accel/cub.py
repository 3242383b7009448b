"""Device-wide primitives: the ``Cub`` handle (``dev.cub()``) and its operator choices.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Cub
from atomr_accel._public import publish as _publish
from atomr_accel.core.ops._cub import ReduceKind, ScanKind

__all__ = ["Cub", "ReduceKind", "ScanKind"]

_publish(__name__)
