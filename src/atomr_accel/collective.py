"""The original package's ``atomr_accel.collective``: ``Collective`` (here the NCCL-style
collectives over a world of devices, ``System.nccl_world``), its per-rank and grouped
views, the reduction operators and the error a failed epoch raises."""

from atomr_accel.core import CollectiveAborted
from atomr_accel.core.ops._collective import ReduceOp
from atomr_accel.facade._collective import Collective, CollectiveGroup, CollectiveRank

__all__ = ["Collective", "CollectiveAborted", "CollectiveGroup", "CollectiveRank", "ReduceOp"]
