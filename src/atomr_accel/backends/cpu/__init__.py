"""The CPU backend (NumPy/SciPy): the embedded default and the reference."""

from atomr_accel.backends.cpu._backend import CpuBackend

__all__ = ["CpuBackend"]
