"""The original package's ``atomr_accel.cudnn`` module: the ``Cudnn`` handle."""

from atomr_accel.facade._attn_inputs import MultiHeadAttnBwdInputs
from atomr_accel.facade._dnn import Cudnn

__all__ = ["Cudnn", "MultiHeadAttnBwdInputs"]
