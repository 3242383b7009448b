"""The original package's ``atomr_accel.cudnn`` module: the ``Cudnn`` handle, the
builders of its two backward calls, and ``rnn_weight_count`` (the size of an RNN's
packed weights).

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import Cudnn, MultiHeadAttnBwdInputs, RnnBwdInputs
from atomr_accel._public import publish as _publish
from atomr_accel.core.ops._rnn import rnn_weight_count

__all__ = ["Cudnn", "MultiHeadAttnBwdInputs", "RnnBwdInputs", "rnn_weight_count"]

_publish(__name__)
