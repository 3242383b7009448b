"""The original package's ``atomr_accel.collective``: ``Collective`` (here the
NCCL-style collectives over a world of devices, ``System.nccl_world``), its
per-rank and grouped views, the reduction operators and the error a failed epoch
raises.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Collective, CollectiveAborted
from atomr_accel._public import publish as _publish
from atomr_accel.core.ops._collective import ReduceOp
from atomr_accel.facade import CollectiveGroup, CollectiveRank

__all__ = ["Collective", "CollectiveAborted", "CollectiveGroup", "CollectiveRank", "ReduceOp"]

_publish(__name__)
