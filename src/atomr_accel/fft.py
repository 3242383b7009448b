"""The original package's ``atomr_accel.fft``: ``Fft`` and the R2C size helpers.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Fft
from atomr_accel._public import publish as _publish
from atomr_accel.core.ops._fft import (
    r2c_output_len,
    r2c_output_len_2d,
    r2c_output_len_3d,
    r2c_output_len_many,
)

__all__ = ["Fft", "r2c_output_len", "r2c_output_len_2d", "r2c_output_len_3d", "r2c_output_len_many"]

_publish(__name__)
