"""Small ONNX models built with ``onnx.helper`` and NumPy references of them, shared by the
CPU and GPU ONNX tests and the benchmark: an MLP and a conv net, random weights."""

from __future__ import annotations

from typing import Any

import numpy as np

Arr = np.ndarray[Any, Any]


def _initializer(name: str, value: Arr) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(value, name)


def mlp(rng: np.random.Generator, features: int = 16, hidden: int = 32, classes: int = 8,
        ) -> tuple[bytes, dict[str, Arr]]:
    """``y = relu(x @ w1 + b1) @ w2 + b2`` over a free batch axis: (model bytes, weights)."""
    from onnx import TensorProto, helper

    weights = {
        "w1": rng.standard_normal((features, hidden)).astype(np.float32) / 4,
        "b1": rng.standard_normal(hidden).astype(np.float32),
        "w2": rng.standard_normal((hidden, classes)).astype(np.float32) / 4,
        "b2": rng.standard_normal(classes).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["y0"]),
        helper.make_node("Add", ["y0", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", classes])],
        [_initializer(k, v) for k, v in weights.items()])
    return _serialized(graph), weights


def mlp_reference(x: Arr, w: dict[str, Arr]) -> Arr:
    """The MLP in float64 NumPy."""
    h = np.maximum(x.astype(np.float64) @ w["w1"] + w["b1"], 0.0)
    return h @ w["w2"] + w["b2"]  # type: ignore[no-any-return]


def convnet(rng: np.random.Generator, channels: int = 3, filters: int = 4, size: int = 8,
            ) -> tuple[bytes, dict[str, Arr]]:
    """Conv 3x3 (pad 1) + bias, ReLU, 2x2 max pool, then a linear layer over the flattened
    maps, and a second output: the pooled maps. (model bytes, weights)."""
    from onnx import TensorProto, helper

    half = size // 2
    flat = filters * half * half
    weights = {
        "k": rng.standard_normal((filters, channels, 3, 3)).astype(np.float32) / 3,
        "kb": rng.standard_normal(filters).astype(np.float32),
        "fc": rng.standard_normal((flat, 5)).astype(np.float32) / 8,
    }
    nodes = [
        helper.make_node("Conv", ["img", "k", "kb"], ["c"], pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pooled"], ["f"], axis=1),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, ["n", channels, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 5]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT,
                                       ["n", filters, half, half])],
        [_initializer(k, v) for k, v in weights.items()])
    return _serialized(graph), weights


def convnet_reference(img: Arr, w: dict[str, Arr]) -> tuple[Arr, Arr]:
    """The conv net in float64 NumPy: (logits, pooled)."""
    x = np.pad(img.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # n,c,h,w,3,3
    conv = np.einsum("nchwij,fcij->nfhw", windows, w["k"]) + w["kb"][None, :, None, None]
    r = np.maximum(conv, 0.0)
    n, f, h, wd = r.shape
    pooled = r.reshape(n, f, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
    return pooled.reshape(n, -1) @ w["fc"], pooled


def _serialized(graph: Any) -> bytes:
    from onnx import checker, helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    checker.check_model(model)
    return bytes(model.SerializeToString())
