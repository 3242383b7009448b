"""Deep-learning handles: ``Cudnn``, ``FlashAttn`` and ``BlasLt``.

Their methods come from the ops' declarations (``atomr_accel.core.ops``). On
CUDA they run on NVIDIA's Python libraries, which are optional: ``Cudnn`` and
``FlashAttn`` on the cuDNN frontend (``pip install 'atomr-accel-py[cudnn]'``),
``BlasLt`` on nvmath-python (``pip install 'atomr-accel-py[blaslt]'``). Without
them ``is_available()`` is False and every call raises ``LibraryUnavailable``
naming the package. The CPU backend runs them all on NumPy.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._libraries import LibraryAvailable
from atomr_accel.facade._api import BlasLtApi, CudnnApi, FlashAttnApi
from atomr_accel.facade._attn_inputs import MultiHeadAttnBwdInputs
from atomr_accel.facade._libraries import Library
from atomr_accel.facade._portal import blocking
from atomr_accel.facade._rnn_inputs import RnnBwdInputs

__all__ = ["BlasLt", "Cudnn", "FlashAttn", "OptionalLibrary"]

_F32 = (DType.F32,)

Builder = MultiHeadAttnBwdInputs | RnnBwdInputs
"""The original's argument builders of the two backward calls that take one."""


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
        return self._from_builder(inputs, MultiHeadAttnBwdInputs, _F32, timeout_secs)

    multihead_attn_bwd_f32 = blocking(multihead_attn_bwd_f32_async)

    def rnn_bwd_async(self, inputs: RnnBwdInputs, timeout_secs: float | None = 60.0,
                      ) -> Coroutine[Any, Any, str]:
        """RNN backward from the builder ``inputs`` (f32 or f64): ``dx``, ``dweights``,
        ``dh_in``, ``dc_in``; consumes ``inputs``; answers the path that ran."""
        return self._from_builder(inputs, RnnBwdInputs, None, timeout_secs)

    rnn_bwd = blocking(rnn_bwd_async)

    def rnn_bwd_f32_async(self, inputs: RnnBwdInputs, timeout_secs: float | None = 60.0,
                          ) -> Coroutine[Any, Any, str]:
        """The original's RNN backward from the builder ``inputs`` (f32 buffers): ``dx``,
        ``dweights``, ``dh_in``, ``dc_in``; consumes ``inputs``; answers the path."""
        return self._from_builder(inputs, RnnBwdInputs, _F32, timeout_secs)

    rnn_bwd_f32 = blocking(rnn_bwd_f32_async)

    def _from_builder(self, inputs: Builder, kind: type[Builder],
                      dtypes: tuple[DType, ...] | None,
                      timeout_secs: float | None) -> Coroutine[Any, Any, str]:
        """Run the op a builder (the original's ``*BwdInputs``) makes; it is consumed once the
        op is accepted, so a builder refused for bad input can be fixed and passed again."""
        if not isinstance(inputs, kind):
            raise InvalidArgument(f"inputs must be a {kind.__name__}, got {inputs!r}")
        running = self._submit(inputs.build(self._ref, dtypes), timeout_secs)
        inputs.consume()
        return running


class FlashAttn(OptionalLibrary, FlashAttnApi):
    """Scaled-dot-product attention on one device: causal and sliding-window masks, ALiBi,
    sink tokens, MQA/GQA, ragged batches and paged KV caches."""

    library: ClassVar[str] = "flashattn"


class BlasLt(OptionalLibrary, BlasLtApi):
    """Matmuls with fused epilogues (bias, ReLU, GELU and their gradients) on one device."""

    library: ClassVar[str] = "blaslt"
