"""The original package's ``atomr_accel.solver``: ``Solver``."""

from atomr_accel.facade._libraries import Solver

__all__ = ["Solver"]
