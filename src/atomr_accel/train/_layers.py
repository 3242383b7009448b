"""The ops of one layer on one device, given its buffers: a small internal API.

``ModelReplica`` runs a model with these functions, and the parallel trainers
may run single layers (a column- or row-parallel shard of a ``Linear`` is a
``Linear`` of the shard's sizes with its own ``ParamSlot``) with them too.

* ``ParamSlot(bucket, weight_offset, bias_offset)``: where a parametrized
  layer's parameters are, in the parameter buffer ``params`` of its bucket (the
  gradients at the same offsets of the bucket's gradient buffer).
* ``Saved``: what a layer's forward keeps for its backward (LayerNorm's
  statistics, Dropout's mask), allocated by ``saved_sizes``.
* ``forward_ops(layer, x, y, rows, features, params, slot, saved, train, seed,
  seeds)``
  -> ops computing ``y`` from ``x`` (``rows x features`` in, ``rows x
  layer.features_out(features)`` out). ``aliases(layer, train)`` says when a
  layer computes nothing (``Flatten``, ``Dropout`` in evaluation or with
  ``p = 0``): then ``y`` is ``x`` and no op is made.
* ``backward_ops(layer, x, dy, dx, rows, features, params, grads, slot, saved)``
  -> ops adding the layer's parameter gradients into ``grads`` and writing
  ``dx`` (None: not wanted; its parameter gradients still accumulate).

Element-wise layers run the ``cudnn`` library's ``ActivationForward`` /
``ActivationBackward`` and ``DropoutForward`` / ``DropoutBackward``;
``Linear`` and ``LayerNorm`` run the ``train`` library's ops, which address
parameters by offset in a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

from atomr_accel.core._op import Op
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._dnn import (
    Activation,
    ActivationBackward,
    ActivationForward,
    DropoutBackward,
    DropoutForward,
)
from atomr_accel.core.ops._train import (
    LayerNormBackward,
    LayerNormForward,
    LinearBackward,
    LinearForward,
)
from atomr_accel.train._model import (
    GELU,
    Dropout,
    Flatten,
    Layer,
    LayerNorm,
    Linear,
    ReLU,
    Sigmoid,
    Tanh,
)

__all__ = [
    "ParamSlot",
    "Saved",
    "activation_kind",
    "aliases",
    "backward_ops",
    "forward_ops",
    "saved_sizes",
]


@dataclass(frozen=True, slots=True)
class ParamSlot:
    """Where a parametrized layer's parameters are: its bucket (index into the replica's
    parameter and gradient buffers) and the offsets of its weight and bias there."""

    bucket: int
    weight_offset: int
    bias_offset: int | None


@dataclass(frozen=True, slots=True)
class Saved:
    """What a layer's forward keeps for its backward: ``mean`` / ``rstd`` (LayerNorm, one
    per row) or ``mask`` (Dropout, u8, one per element); None where not used."""

    mean: GpuRef | None = None
    rstd: GpuRef | None = None
    mask: GpuRef | None = None


def activation_kind(layer: Layer) -> Activation | None:
    """The ``cudnn`` activation an element-wise layer runs (None for other layers)."""
    if isinstance(layer, ReLU):
        return Activation.RELU
    if isinstance(layer, GELU):
        return Activation.GELU if layer.approximate == "none" else Activation.GELU_APPROX
    if isinstance(layer, Tanh):
        return Activation.TANH
    if isinstance(layer, Sigmoid):
        return Activation.SIGMOID
    return None


def aliases(layer: Layer, train: bool) -> bool:
    """Whether the layer's output is its input, unchanged (no op, no buffer)."""
    if isinstance(layer, Flatten):
        return True
    if isinstance(layer, Dropout):
        return not train or layer.p == 0.0
    return False


def saved_sizes(layer: Layer, rows: int, features: int, train: bool) -> dict[str, int]:
    """The saved buffers a layer's forward needs: name -> element count (``mask`` is u8,
    the others have the data's dtype)."""
    if isinstance(layer, LayerNorm):
        return {"mean": rows, "rstd": rows}
    if isinstance(layer, Dropout) and not aliases(layer, train):
        return {"mask": rows * features}
    return {}


def forward_ops(layer: Layer, x: GpuRef, y: GpuRef, rows: int, features: int,
                params: GpuRef | None, slot: ParamSlot | None, saved: Saved, train: bool,
                seed: int, seeds: GpuRef | None = None) -> list[Op]:
    """The ops computing ``y`` from ``x`` for one layer (empty when ``aliases``); ``seed``
    draws a Dropout mask (same seed, same mask), or with ``seeds`` (a u64 buffer) the
    seed is ``seeds[seed]`` as the op runs."""
    if isinstance(layer, Linear):
        assert params is not None and slot is not None
        return [LinearForward(x, params, y, rows, layer.in_features, layer.out_features,
                              slot.weight_offset, slot.bias_offset)]
    if isinstance(layer, LayerNorm):
        assert params is not None and slot is not None and slot.bias_offset is not None
        assert saved.mean is not None and saved.rstd is not None
        return [LayerNormForward(x, params, y, saved.mean, saved.rstd, rows, features,
                                 slot.weight_offset, slot.bias_offset, layer.eps)]
    kind = activation_kind(layer)
    if kind is not None:
        return [ActivationForward(x, y, (rows * features,), kind)]
    if isinstance(layer, Dropout) and not aliases(layer, train):
        assert saved.mask is not None
        return [DropoutForward(x, y, saved.mask, (rows * features,), layer.p, seed, seeds)]
    return []


def backward_ops(layer: Layer, x: GpuRef, dy: GpuRef, dx: GpuRef | None, rows: int,
                 features: int, params: GpuRef | None, grads: GpuRef | None,
                 slot: ParamSlot | None, saved: Saved) -> list[Op]:
    """The ops of one layer's backward: parameter gradients added into ``grads``, ``dx``
    written (None: not wanted). ``x`` is the layer's forward input, ``features`` its size."""
    if isinstance(layer, Linear):
        assert params is not None and grads is not None and slot is not None
        return [LinearBackward(x, params, dy, grads, dx, rows, layer.in_features,
                               layer.out_features, slot.weight_offset, slot.bias_offset)]
    if isinstance(layer, LayerNorm):
        assert params is not None and grads is not None and slot is not None
        assert slot.bias_offset is not None and saved.mean is not None
        assert saved.rstd is not None
        return [LayerNormBackward(x, params, dy, saved.mean, saved.rstd, grads, dx, rows,
                                  features, slot.weight_offset, slot.bias_offset)]
    if dx is None:
        return []
    kind = activation_kind(layer)
    if kind is not None:
        return [ActivationBackward(x, dy, dx, (rows * features,), kind)]
    if isinstance(layer, Dropout) and saved.mask is not None:
        return [DropoutBackward(dy, saved.mask, dx, (rows * features,), layer.p)]
    raise AssertionError(f"{layer!r} aliases its input: it has no backward op")
