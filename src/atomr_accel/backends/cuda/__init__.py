"""The CUDA backend (CuPy). Imported only when a CUDA device is asked for."""

from atomr_accel.backends.cuda._backend import CudaBackend

__all__ = ["CudaBackend"]
