"""Deep-learning handles: ``Cudnn``, ``FlashAttn`` and ``BlasLt``.

Their methods come from the ops' declarations (``atomr_accel.core.ops``). On
CUDA they run on NVIDIA's Python libraries, which are optional: ``Cudnn`` and
``FlashAttn`` on the cuDNN frontend (``pip install 'atomr-accel[cudnn]'``),
``BlasLt`` on nvmath-python (``pip install 'atomr-accel[blaslt]'``). Without
them ``is_available()`` is False and every call raises ``LibraryUnavailable``
naming the package. The CPU backend runs them all on NumPy.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._attention import MultiHeadAttnBackward
from atomr_accel.core.ops._libraries import LibraryAvailable
from atomr_accel.facade._api import BlasLtApi, CudnnApi, FlashAttnApi
from atomr_accel.facade._attn_inputs import MultiHeadAttnBwdInputs
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._portal import blocking

__all__ = ["BlasLt", "Cudnn", "FlashAttn", "OptionalLibrary"]

_F32 = (DType.F32,)
_ATTN_BUFFERS = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


class OptionalLibrary(Library):
    """A handle whose library may need an optional Python package on CUDA."""

    library: ClassVar[str]

    def is_available_async(self, timeout_secs: float | None = None,
                           ) -> Coroutine[Any, Any, bool]:
        """Whether this library can run on the device (asked of its context)."""
        return self._submit(LibraryAvailable(self.library), timeout_secs)

    is_available = blocking(is_available_async)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device.device_id})"


class Cudnn(OptionalLibrary, CudnnApi):
    """cuDNN on one device: convolutions, pooling, softmax, activations, normalizations,
    dropout, LRN, RNNs and multi-head attention, in the original package's names."""

    library: ClassVar[str] = "cudnn"

    def multihead_attn_bwd_f32_async(self, inputs: MultiHeadAttnBwdInputs,
                                     timeout_secs: float | None = 60.0,
                                     ) -> Coroutine[Any, Any, str]:
        """Multi-head attention backward from a ``MultiHeadAttnBwdInputs`` (consumed by the
        call): writes ``dq``, ``dk``, ``dv``; f32 buffers. Runs ``MultiHeadAttnBackward``;
        answers the path that ran."""
        if not isinstance(inputs, MultiHeadAttnBwdInputs):
            raise InvalidArgument(f"inputs must be a MultiHeadAttnBwdInputs, got {inputs!r}")
        values = inputs.take()
        refs = {name: self._ref(values[name], name, _F32) for name in _ATTN_BUFFERS}
        stats = values["stats"]
        op = MultiHeadAttnBackward(
            refs["q"], refs["k"], refs["v"], refs["o"], refs["do"], refs["dq"], refs["dk"],
            refs["dv"], values["batch"], values["seq_q"], values["seq_kv"], values["heads_q"],
            values["heads_kv"], values["head_dim"],
            None if stats is None else self._ref(stats, "stats", _F32), values["mask"],
            values["window"], values["scale"], values["dropout"], values["dropout_seed"])
        return self._submit(op, timeout_secs)

    multihead_attn_bwd_f32 = blocking(multihead_attn_bwd_f32_async)


class FlashAttn(OptionalLibrary, FlashAttnApi):
    """Scaled-dot-product attention on one device: causal and sliding-window masks, ALiBi,
    sink tokens, MQA/GQA, ragged batches and paged KV caches."""

    library: ClassVar[str] = "flashattn"


class BlasLt(OptionalLibrary, BlasLtApi):
    """Matmuls with fused epilogues (bias, ReLU, GELU and their gradients) on one device."""

    library: ClassVar[str] = "blaslt"
