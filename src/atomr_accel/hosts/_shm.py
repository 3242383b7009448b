"""The shared-memory helpers the hosts use, re-exported from ``backends/_shm.py`` (where
both the hosts and the backends may reach them)."""

from atomr_accel.backends import _shm
from atomr_accel.backends._shm import *  # noqa: F403

__all__ = _shm.__all__
