"""The original package's ``atomr_accel.rng``: ``RngGenerator``.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import RngGenerator
from atomr_accel._public import publish as _publish

__all__ = ["RngGenerator"]

_publish(__name__)
