"""The method sets of the handles, generated from the ops' declarations (``Op.api``).

``_api.pyi`` holds their typed stub: run ``python -m atomr_accel.facade`` after
changing a declaration (a test says when it is out of date).
"""

from __future__ import annotations

from atomr_accel.facade._generate import Generated

__all__ = [
    "BlasApi", "BlasLtApi", "CubApi", "CudnnApi", "CutlassApi", "DeviceApi", "FftApi",
    "FlashAttnApi", "RngApi", "SolverApi", "SparseApi", "TensorApi",
]


class BlasApi(Generated, handle="blas"):
    """The BLAS methods (``Blas``)."""


class FftApi(Generated, handle="fft"):
    """The FFT methods (``Fft``)."""


class RngApi(Generated, handle="rng"):
    """The random fills (``RngGenerator``)."""


class SolverApi(Generated, handle="solver"):
    """The dense solver methods (``Solver``)."""


class SparseApi(Generated, handle="sparse"):
    """The sparse methods (``Sparse``)."""


class TensorApi(Generated, handle="tensor"):
    """The tensor methods (``Tensor``)."""


class CudnnApi(Generated, handle="cudnn"):
    """The cuDNN methods (``Cudnn``)."""


class FlashAttnApi(Generated, handle="flashattn"):
    """The attention methods (``FlashAttn``)."""


class BlasLtApi(Generated, handle="blaslt"):
    """The fused-matmul methods (``BlasLt``)."""


class CubApi(Generated, handle="cub"):
    """The device-wide primitives (``Cub``)."""


class CutlassApi(Generated, handle="cutlass"):
    """The CUTLASS kernel methods (``Cutlass``)."""


class DeviceApi(Generated, handle="device"):
    """The methods of ``Device`` declared by ops (``free``, ``copy``, ``sgemm``, ...)."""
