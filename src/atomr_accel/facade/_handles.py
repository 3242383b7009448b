"""The catalogued libraries' handle classes, for ``atomr_accel.facade`` and
``atomr_accel`` to export: ``python -m atomr_accel.facade`` writes it from the catalogue."""

from atomr_accel.facade._cub import Cub
from atomr_accel.facade._cutlass import Cutlass
from atomr_accel.facade._dnn import BlasLt, Cudnn, FlashAttn
from atomr_accel.facade._libraries import Blas, Fft, RngGenerator, Solver, Sparse, Tensor
from atomr_accel.facade._onnx import Onnx

__all__ = [
    "Blas",
    "BlasLt",
    "Cub",
    "Cudnn",
    "Cutlass",
    "Fft",
    "FlashAttn",
    "Onnx",
    "RngGenerator",
    "Solver",
    "Sparse",
    "Tensor",
]
