"""The original package's ``atomr_accel.solver``: ``Solver``.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Solver
from atomr_accel._public import publish as _publish

__all__ = ["Solver"]

_publish(__name__)
