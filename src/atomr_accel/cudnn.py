"""The original package's ``atomr_accel.cudnn`` module: the ``Cudnn`` handle."""

from atomr_accel.core.ops._rnn import rnn_weight_count
from atomr_accel.facade._dnn import Cudnn
from atomr_accel.facade._rnn_inputs import RnnBwdInputs

__all__ = ["Cudnn", "RnnBwdInputs", "rnn_weight_count"]
