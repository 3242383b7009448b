"""The original package's ``atomr_accel.system``: ``System``."""

from atomr_accel.facade._system import System

__all__ = ["System"]
