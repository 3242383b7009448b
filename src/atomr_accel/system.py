"""The original package's ``atomr_accel.system``: ``System``.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import System
from atomr_accel._public import publish as _publish

__all__ = ["System"]

_publish(__name__)
