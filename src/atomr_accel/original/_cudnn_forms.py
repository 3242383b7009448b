"""The original package's cuDNN methods (``conv2d_fwd_f32``, ``batch_norm_f32``,
``rnn_fwd_f32``, ...): each our form of the op, on f32 buffers, with ``timeout_secs`` as its
last positional parameter."""

from __future__ import annotations

import dataclasses

from atomr_accel.core._api import attach
from atomr_accel.core._dtype import DType
from atomr_accel.core._op import Op
from atomr_accel.core.ops import _dnn, _norm, _rnn

__all__: list[str] = []


def _f32(op: type[Op], note: str) -> None:
    """Attach ``name_f32``: ``op``'s form on f32 buffers."""
    attach(op, dataclasses.replace(op.api[0], dtypes=(DType.F32,), timeout_last=True, note=note))


_DNN: tuple[type[Op], ...] = (
    _dnn.Conv2dForward, _dnn.Conv2dBackwardData, _dnn.Conv2dBackwardFilter, _dnn.Pool2dForward,
    _dnn.Pool2dBackward, _dnn.SoftmaxForward, _dnn.SoftmaxBackward, _dnn.ActivationForward,
    _dnn.ActivationBackward, _dnn.DropoutForward, _dnn.DropoutBackward, _dnn.LrnForward)
_PATH_ANSWERING: tuple[type[Op], ...] = (
    _norm.BatchNorm, _norm.LayerNorm, _norm.InstanceNorm, _norm.GroupNorm, _norm.RmsNorm,
    _norm.NormBwd, _rnn.RnnFwd)

for _op in _DNN:
    _f32(_op, "The original package's form.")
for _op in _PATH_ANSWERING:
    _f32(_op, "The original package's form; answers the path that ran.")
