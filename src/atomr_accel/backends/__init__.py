"""Backends: where ops actually run. ``cpu`` (NumPy/SciPy) is the reference."""


def cuda_device_count() -> int:
    """Number of CUDA devices visible to CuPy; 0 without CuPy or a GPU."""
    try:
        import cupy
    except Exception:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


__all__ = ["cuda_device_count"]
