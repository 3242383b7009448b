"""The original package's attention methods: ``FlashAttn.forward_f16`` (whether a
configuration runs here) and ``Cudnn.multihead_attn_fwd_f32``, attached to their ops."""

from __future__ import annotations

from atomr_accel.core._api import Form, attach
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._attention import MultiHeadAttnForward, SdpaSupport
from atomr_accel.original._options import original

__all__: list[str] = []

attach(SdpaSupport, Form("forward_f16", ("arch", "head_dim", "gqa_ratio", "mask", "window",
                                         "alibi", "sink_tokens", "softmax_scale"),
                         timeout=10.0, returns="str", timeout_last=True))
attach(MultiHeadAttnForward, original(
    "multihead_attn_fwd", ("q", "k", "v", "o", "batch", "seq_q", "seq_kv", "heads_q", "heads_kv",
                           "head_dim"), 60.0, returns="str", dtypes=(DType.F32,)))
