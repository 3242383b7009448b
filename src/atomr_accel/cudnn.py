"""The original package's ``atomr_accel.cudnn`` module: the ``Cudnn`` handle, the builders of
its two backward calls, and ``rnn_weight_count`` (the size of an RNN's packed weights)."""

from atomr_accel.core.ops._rnn import rnn_weight_count
from atomr_accel.facade._attn_inputs import MultiHeadAttnBwdInputs
from atomr_accel.facade._dnn import Cudnn
from atomr_accel.facade._rnn_inputs import RnnBwdInputs

__all__ = ["Cudnn", "MultiHeadAttnBwdInputs", "RnnBwdInputs", "rnn_weight_count"]
