"""Backends: where ops actually run. ``cpu`` (NumPy/SciPy) is the reference.

The layers above reach a backend only through this package: its capabilities
and class by name (``capabilities``, ``backend_class``), never ``backends.cpu``
or ``backends.cuda`` themselves.
"""

from atomr_accel.backends._registry import (
    BACKENDS,
    Capabilities,
    backend_class,
    capabilities,
    communicator_id,
)


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


def cuda_capability(device_id: int) -> tuple[int, int]:
    """The compute capability of CUDA device ``device_id``, read in this process through
    CuPy; ``(0, 0)`` where CuPy cannot tell (not installed here, or no such device)."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(device_id)
        return int(props["major"]), int(props["minor"])
    except Exception:
        return (0, 0)


__all__ = [
    "BACKENDS",
    "Capabilities",
    "backend_class",
    "capabilities",
    "communicator_id",
    "cuda_capability",
    "cuda_device_count",
]
