"""Model descriptions: plain, picklable layer objects and ``Sequential``.

A description holds no device state: ``ModelReplica`` instantiates it on one
device. Names and initial values follow PyTorch, so a user can copy the
weights of an equal ``torch.nn.Sequential`` into ``parameters=``:

* ``Linear(in_features, out_features, bias=True)``: ``weight`` of shape
  ``(out, in)`` and ``bias`` of shape ``(out,)``, both uniform in
  ``[-1/sqrt(in), 1/sqrt(in)]`` (torch's kaiming-uniform with ``a=sqrt(5)``
  and its bias rule); ``y = x @ weight.T + bias`` over the last axis.
* ``LayerNorm(n, eps=1e-5)``: ``weight`` ones and ``bias`` zeros, over the last axis.
* ``ReLU``, ``GELU(approximate="none"|"tanh")``, ``Tanh``, ``Sigmoid``,
  ``Dropout(p)`` (inverted dropout, identity in evaluation) and ``Flatten()``
  (all axes after the batch axis into one) have no parameters.

``Sequential(*layers)`` names its parameters ``"<index>.weight"`` /
``"<index>.bias"`` as ``torch.nn.Sequential`` does. ``model[a:b]`` is a
``Sequential`` of those layers that keeps their original indices (as torch's
slicing does), so the stages of a pipeline keep the full model's names.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import is_int

__all__ = [
    "GELU",
    "Dropout",
    "Flatten",
    "Layer",
    "LayerNorm",
    "Linear",
    "ReLU",
    "Sequential",
    "Sigmoid",
    "Tanh",
    "TRAIN_DTYPES",
    "train_dtype",
]

TRAIN_DTYPES = (DType.F32, DType.F64)
"""The dtypes of a replica's parameters and activations: f32, and f64 for float64 checks."""

Array = np.ndarray[Any, Any]


def train_dtype(dtype: object) -> DType:
    """``dtype`` as a ``DType`` of ``TRAIN_DTYPES`` (``InvalidArgument`` otherwise)."""
    try:
        value = DType.of(dtype)
    except Exception as exc:
        raise InvalidArgument(f"dtype must be 'f32' or 'f64', got {dtype!r}") from exc
    if value not in TRAIN_DTYPES:
        raise InvalidArgument(f"dtype must be 'f32' or 'f64' (bf16/f16 parameters are not "
                              f"supported yet), got {value.value!r}")
    return value


def _positive(name: str, value: object) -> int:
    if not is_int(value) or int(value) < 1:
        raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
    return int(value)


class Layer:
    """Base of the layer descriptions: ``parameter_shapes`` and ``init_parameters``."""

    __slots__ = ()

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The layer's parameters by local name (``"weight"``, ``"bias"``), in order."""
        return {}

    def init_parameters(self, rng: np.random.Generator) -> dict[str, Array]:
        """Fresh float64 values of the parameters (torch's default initialisation)."""
        return {}

    def features_out(self, features: int) -> int:
        """The size of the last axis out of the layer, given the size into it."""
        return features


@dataclass(frozen=True, slots=True)
class Linear(Layer):
    """``y = x @ weight.T + bias`` over the last axis (``weight``: ``(out, in)``)."""

    in_features: int
    out_features: int
    bias: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_features", _positive("in_features", self.in_features))
        object.__setattr__(self, "out_features", _positive("out_features", self.out_features))
        if not isinstance(self.bias, bool):
            raise InvalidArgument(f"bias must be a bool, got {self.bias!r}")

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {"weight": (self.out_features, self.in_features)}
        if self.bias:
            shapes["bias"] = (self.out_features,)
        return shapes

    def init_parameters(self, rng: np.random.Generator) -> dict[str, Array]:
        bound = 1.0 / math.sqrt(self.in_features)
        values = {"weight": rng.uniform(-bound, bound, (self.out_features, self.in_features))}
        if self.bias:
            values["bias"] = rng.uniform(-bound, bound, (self.out_features,))
        return values

    def features_out(self, features: int) -> int:
        if features != self.in_features:
            raise InvalidArgument(f"{self!r} takes {self.in_features} features, got {features}")
        return self.out_features


@dataclass(frozen=True, slots=True)
class LayerNorm(Layer):
    """Normalize the last axis (``n`` features) to zero mean and unit variance, then
    ``* weight + bias`` (biased variance, ``eps`` inside the square root, as torch)."""

    n: int
    eps: float = 1e-5

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _positive("n", self.n))
        if (not isinstance(self.eps, int | float) or isinstance(self.eps, bool)
                or not self.eps > 0 or not math.isfinite(self.eps)):
            raise InvalidArgument(f"eps must be a positive number, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"weight": (self.n,), "bias": (self.n,)}

    def init_parameters(self, rng: np.random.Generator) -> dict[str, Array]:
        return {"weight": np.ones(self.n), "bias": np.zeros(self.n)}

    def features_out(self, features: int) -> int:
        if features != self.n:
            raise InvalidArgument(f"{self!r} normalizes {self.n} features, got {features}")
        return features


@dataclass(frozen=True, slots=True)
class ReLU(Layer):
    """``max(x, 0)``."""


@dataclass(frozen=True, slots=True)
class GELU(Layer):
    """GELU: exact (``approximate="none"``, with erf, torch's default) or the tanh form."""

    approximate: str = "none"

    def __post_init__(self) -> None:
        if self.approximate not in ("none", "tanh"):
            raise InvalidArgument(f"approximate must be 'none' or 'tanh', "
                                  f"got {self.approximate!r}")


@dataclass(frozen=True, slots=True)
class Tanh(Layer):
    """``tanh(x)``."""


@dataclass(frozen=True, slots=True)
class Sigmoid(Layer):
    """``1 / (1 + exp(-x))``."""


@dataclass(frozen=True, slots=True)
class Dropout(Layer):
    """Zero each element with probability ``p`` and scale the others by ``1 / (1 - p)``
    while training; the identity in evaluation."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if (not isinstance(self.p, int | float) or isinstance(self.p, bool)
                or not 0.0 <= self.p < 1.0):
            raise InvalidArgument(f"p must be a number in [0, 1), got {self.p!r}")
        object.__setattr__(self, "p", float(self.p))


@dataclass(frozen=True, slots=True)
class Flatten(Layer):
    """All axes after the batch axis into one (the data stay where they are)."""


class Sequential:
    """Layers applied in order; parameters named ``"<index>.<name>"`` as in torch.

    ``len(model)``, iteration, ``model[i]`` (a layer) and ``model[a:b]`` (a
    ``Sequential`` keeping the original indices, so its parameter names are
    the full model's) work as on ``torch.nn.Sequential``.
    """

    __slots__ = ("_indices", "_layers")

    def __init__(self, *layers: Layer, indices: tuple[int, ...] | None = None) -> None:
        for layer in layers:
            if not isinstance(layer, Layer):
                raise InvalidArgument(f"Sequential takes layers (Linear, ReLU, ...), got "
                                      f"{type(layer).__name__}")
        if not layers:
            raise InvalidArgument("Sequential needs at least one layer")
        if indices is None:
            indices = tuple(range(len(layers)))
        elif len(indices) != len(layers) or not all(is_int(i) and i >= 0 for i in indices):
            raise InvalidArgument(f"indices must be one int >= 0 per layer, got {indices!r}")
        self._layers = tuple(layers)
        self._indices = tuple(int(i) for i in indices)

    @property
    def layers(self) -> tuple[Layer, ...]:
        """The layers, in order."""
        return self._layers

    @property
    def indices(self) -> tuple[int, ...]:
        """Each layer's index in the model it was sliced from (its name prefix)."""
        return self._indices

    def __len__(self) -> int:
        return len(self._layers)

    def __iter__(self) -> Iterator[Layer]:
        return iter(self._layers)

    @overload
    def __getitem__(self, index: int) -> Layer: ...
    @overload
    def __getitem__(self, index: slice) -> Sequential: ...

    def __getitem__(self, index: int | slice) -> Layer | Sequential:
        if isinstance(index, slice):
            return Sequential(*self._layers[index], indices=self._indices[index])
        if not is_int(index):
            raise InvalidArgument(f"index a Sequential with an int or a slice, got {index!r}")
        try:
            return self._layers[index]
        except IndexError as exc:
            raise InvalidArgument(f"layer {index} out of range for {len(self)} layers") from exc

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Sequential) and self._layers == other._layers
                and self._indices == other._indices)

    def __hash__(self) -> int:
        return hash((self._layers, self._indices))

    def __repr__(self) -> str:
        inner = ", ".join(f"{i}: {layer!r}" for i, layer in zip(self._indices, self._layers,
                                                                 strict=True))
        return f"Sequential({inner})"

    def __getstate__(self) -> tuple[tuple[Layer, ...], tuple[int, ...]]:
        return self._layers, self._indices

    def __setstate__(self, state: tuple[tuple[Layer, ...], tuple[int, ...]]) -> None:
        self._layers, self._indices = state

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape by torch-style name, in declaration order."""
        return {f"{i}.{name}": shape for i, layer in zip(self._indices, self._layers,
                                                          strict=True)
                for name, shape in layer.parameter_shapes().items()}

    def init_parameters(self, seed: int = 0, dtype: DType | str = "f32") -> dict[str, Array]:
        """Fresh parameters as torch initialises them (uniform ``+-1/sqrt(fan_in)`` for
        ``Linear``, ones/zeros for ``LayerNorm``), drawn from ``numpy.random.default_rng
        (seed)`` layer by layer, as host arrays of ``dtype`` named like ``"0.weight"``."""
        if not is_int(seed) or seed < 0:
            raise InvalidArgument(f"seed must be an int >= 0, got {seed!r}")
        numpy_dtype = train_dtype(dtype).numpy
        rng = np.random.default_rng(int(seed))
        out: dict[str, Array] = {}
        for i, layer in zip(self._indices, self._layers, strict=True):
            for name, value in layer.init_parameters(rng).items():
                out[f"{i}.{name}"] = np.ascontiguousarray(value, dtype=numpy_dtype)
        return out

    def features_out(self, features: int) -> int:
        """The size of the last axis out of the model for ``features`` into it
        (``InvalidArgument`` where a layer does not fit)."""
        for layer in self._layers:
            features = layer.features_out(features)
        return features

    def in_features(self) -> int | None:
        """The input's last-axis size the first ``Linear`` or ``LayerNorm`` fixes (None
        when no layer fixes it)."""
        for layer in self._layers:
            if isinstance(layer, Linear):
                return layer.in_features
            if isinstance(layer, LayerNorm):
                return layer.n
            if isinstance(layer, Flatten):
                return None
        return None
