"""The original package's ``atomr_accel.fft``: ``Fft`` and the R2C size helpers."""

from atomr_accel.core.ops._fft import (
    r2c_output_len,
    r2c_output_len_2d,
    r2c_output_len_3d,
    r2c_output_len_many,
)
from atomr_accel.facade._libraries import Fft

__all__ = [
    "Fft",
    "r2c_output_len",
    "r2c_output_len_2d",
    "r2c_output_len_3d",
    "r2c_output_len_many",
]
