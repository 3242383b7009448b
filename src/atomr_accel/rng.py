"""The original package's ``atomr_accel.rng``: ``RngGenerator``."""

from atomr_accel.facade._libraries import RngGenerator

__all__ = ["RngGenerator"]
