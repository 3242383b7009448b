"""How a ``Sequential`` is split for tensor parallelism (Megatron style): plain decisions.

The model is cut into **segments**. A *sharded* segment is a ``Linear(a, b)``,
any element-wise activations (``ReLU``, ``GELU``, ``Tanh``, ``Sigmoid``), then
a ``Linear(b, c)``: on ``n`` devices the first is split **column-parallel**
(device ``k`` holds rows ``k`` of its weight and bias: ``b_k`` of the ``b``
outputs, ``numpy.array_split`` sizes), the activations act on each device's
``b_k`` features, and the second is split **row-parallel** (device ``k``
holds the matching ``b_k`` columns of its weight; the bias lives on device 0
only). Each device's output of the segment is then a partial sum: forward
all-reduces it (sum), and backward all-reduces the input gradient, which the
column-parallel layer leaves partial on each device. Every other layer
(``LayerNorm``, ``Dropout``, ``Flatten``, a ``Linear`` with no partner) forms
*replicated* segments: every device holds all of it and computes the same
values (dropout draws the same mask on every device: one seed).

``shard_model`` gives each device's ``Sequential`` of a segment (keeping the
full model's layer indices, so parameter names match), ``shard_parameters``
cuts the full model's parameters for it and ``merge_parameters`` puts the
shards back together (the inverse, for ``state_dict``; it also merges
optimizer state of the same layout).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atomr_accel.train._model import GELU, Array, Linear, ReLU, Sequential, Sigmoid, Tanh

__all__ = ["Segment", "merge_parameters", "segments", "shard_model", "shard_parameters",
           "split_sizes"]

_ELEMENTWISE = (ReLU, GELU, Tanh, Sigmoid)


@dataclass(frozen=True)
class Segment:
    """Layers ``start`` to ``stop`` (positions in the model) and whether they are sharded."""

    start: int
    stop: int
    sharded: bool


def segments(model: Sequential) -> list[Segment]:
    """Cut ``model`` into sharded pairs (``Linear``, element-wise activations, ``Linear``)
    and the replicated runs between them."""
    layers = model.layers
    out: list[Segment] = []
    run_start, i = 0, 0
    while i < len(layers):
        j = i + 1
        if isinstance(layers[i], Linear):
            while j < len(layers) and isinstance(layers[j], _ELEMENTWISE):
                j += 1
            if j < len(layers) and isinstance(layers[j], Linear):
                if run_start < i:
                    out.append(Segment(run_start, i, False))
                out.append(Segment(i, j + 1, True))
                i = run_start = j + 1
                continue
        i += 1
    if run_start < len(layers):
        out.append(Segment(run_start, len(layers), False))
    return out


def split_sizes(width: int, n: int) -> list[int]:
    """How many of ``width`` features each of ``n`` devices holds (``array_split`` sizes)."""
    return [len(part) for part in np.array_split(np.arange(width), n)]


def shard_model(model: Sequential, segment: Segment, rank: int, n: int) -> Sequential:
    """Device ``rank``'s ``Sequential`` of ``segment`` (all of it when replicated)."""
    part = model[segment.start:segment.stop]
    if not segment.sharded:
        return part
    first, *middle, last = part.layers
    assert isinstance(first, Linear) and isinstance(last, Linear)
    width = split_sizes(first.out_features, n)[rank]
    layers = (Linear(first.in_features, width, first.bias), *middle,
              Linear(width, last.out_features, last.bias and rank == 0))
    return Sequential(*layers, indices=part.indices)


def _bounds(width: int, n: int, rank: int) -> slice:
    sizes = split_sizes(width, n)
    start = sum(sizes[:rank])
    return slice(start, start + sizes[rank])


def shard_parameters(model: Sequential, segment: Segment, rank: int, n: int,
                     full: dict[str, Array]) -> dict[str, Array]:
    """Device ``rank``'s parameters of ``segment`` cut from the full model's ``full``
    (names as ``model.parameter_shapes()``)."""
    part = model[segment.start:segment.stop]
    names = part.parameter_shapes()
    if not segment.sharded:
        return {name: full[name] for name in names}
    first, last = part.indices[0], part.indices[-1]
    width = part.layers[0]
    assert isinstance(width, Linear)
    cut = _bounds(width.out_features, n, rank)
    out = {f"{first}.weight": full[f"{first}.weight"][cut],
           f"{last}.weight": full[f"{last}.weight"][:, cut]}
    if f"{first}.bias" in names:
        out[f"{first}.bias"] = full[f"{first}.bias"][cut]
    if f"{last}.bias" in names and rank == 0:
        out[f"{last}.bias"] = full[f"{last}.bias"]
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def merge_parameters(model: Sequential, segment: Segment,
                     shards: list[dict[str, Array]]) -> dict[str, Array]:
    """The full parameters of ``segment`` from every device's shard (``shard_parameters``
    inverted); replicated segments take device 0's."""
    if not segment.sharded:
        return dict(shards[0])
    part = model[segment.start:segment.stop]
    first, last = part.indices[0], part.indices[-1]
    out = {f"{first}.weight": np.concatenate([s[f"{first}.weight"] for s in shards], axis=0),
           f"{last}.weight": np.concatenate([s[f"{last}.weight"] for s in shards], axis=1)}
    if f"{first}.bias" in shards[0]:
        out[f"{first}.bias"] = np.concatenate([s[f"{first}.bias"] for s in shards])
    if f"{last}.bias" in shards[0]:
        out[f"{last}.bias"] = shards[0][f"{last}.bias"]
    return out
