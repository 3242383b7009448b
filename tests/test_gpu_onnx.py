"""OnnxEngine on a CUDA device against the CPU backend and NumPy: buffers bound by pointer
through ONNX Runtime's CUDA execution provider, on the onnx actor's stream.

Where this onnxruntime has no CUDA provider, the default load must raise
``LibraryUnavailable`` naming ``onnxruntime-gpu``, and a model loaded with
``providers=["CPUExecutionProvider"]`` still runs on the CUDA device's
buffers (through the host). Run on a GPU machine:
``PYTHONPATH=src python3 -m pytest -m gpu tests/test_gpu_onnx.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _onnx_models import convnet, convnet_reference, mlp, mlp_reference

from atomr_accel import LibraryUnavailable, System

pytestmark = pytest.mark.gpu

Arr = np.ndarray[Any, Any]
CPU = ["CPUExecutionProvider"]


def assert_close(got: Arr, want: Arr, scale: float = 2e-3) -> None:
    """Equal to ``scale`` of the largest magnitude: ONNX Runtime's CUDA provider may run f32
    GEMMs and convolutions in TF32."""
    np.testing.assert_allclose(got, want, rtol=0, atol=scale * float(np.abs(want).max()))


@pytest.fixture(scope="module")
def ort() -> Any:
    pytest.importorskip("onnx")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def devices(ort: Any) -> Iterator[tuple[Any, Any]]:
    with System.open("onnx-gpu") as system:
        yield system.spawn_device(mock=False), system.spawn_device(mock=True)


def has_cuda_provider(ort: Any) -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def providers(ort: Any) -> list[str] | None:
    """The providers the CUDA-device tests load with: the default (CUDA's) when this
    onnxruntime has it, else the CPU provider."""
    return None if has_cuda_provider(ort) else CPU


def test_providers_are_reported(ort: Any, devices: tuple[Any, Any]) -> None:
    cuda, _ = devices
    model, _ = mlp(np.random.default_rng(0))
    print("onnxruntime", ort.__version__, "providers:", ort.get_available_providers())
    if has_cuda_provider(ort):
        engine = cuda.onnx().load(model)
        assert engine.providers[0] == "CUDAExecutionProvider"
    else:
        with pytest.raises(LibraryUnavailable, match="onnxruntime-gpu") as caught:
            cuda.onnx().load(model)
        assert caught.value.package == "onnxruntime-gpu"


@pytest.mark.parametrize("batch", [1, 33, 256])
def test_mlp_through_buffers_equals_the_cpu_backend(devices: tuple[Any, Any],
                                                    providers: list[str] | None,
                                                    batch: int) -> None:
    cuda, cpu = devices
    model, weights = mlp(np.random.default_rng(1), features=64, hidden=128, classes=10)
    x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
    src = cuda.allocate(batch * 64, "f32")
    dst = cuda.allocate(batch * 10, "f32")
    cuda.copy_from_numpy(src, x)
    engine = cuda.onnx().load(model, providers)
    assert engine.run({"x": (src, (batch, 64))}, outputs={"y": (dst, (batch, 10))}) == {}
    got = cuda.copy_to_numpy(dst, shape=(batch, 10))
    want = cpu.onnx().load(model).run({"x": x})["y"]
    assert_close(got, want)
    assert_close(got, mlp_reference(x, weights))
    host = engine.run({"x": x})["y"]
    assert_close(host, got, 1e-6)


def test_a_chain_of_runs_on_buffers_stays_ordered(devices: tuple[Any, Any],
                                                  providers: list[str] | None) -> None:
    """The output of one run is the input of the next, with no host sync between them."""
    cuda, _ = devices
    model, weights = mlp(np.random.default_rng(2), features=32, hidden=64, classes=32)
    x = np.random.default_rng(3).standard_normal((16, 32)).astype(np.float32)
    a, b = cuda.allocate(16 * 32, "f32"), cuda.allocate(16 * 32, "f32")
    cuda.copy_from_numpy(a, x)
    engine = cuda.onnx().load(model, providers)
    want = x.astype(np.float64)
    for step in range(6):
        src, dst = (a, b) if step % 2 == 0 else (b, a)
        engine.run({"x": (src, (16, 32))}, outputs={"y": (dst, (16, 32))})
        want = mlp_reference(want, weights)
    got = cuda.copy_to_numpy(a, shape=(16, 32))
    assert_close(got, want, 1e-2)


def test_convnet_equals_onnxruntime_the_cpu_backend_and_numpy(
        ort: Any, devices: tuple[Any, Any], providers: list[str] | None) -> None:
    cuda, cpu = devices
    model, weights = convnet(np.random.default_rng(4), channels=3, filters=8, size=16)
    img = np.random.default_rng(5).standard_normal((4, 3, 16, 16)).astype(np.float32)
    src = cuda.allocate(img.size, "f32")
    cuda.copy_from_numpy(src, img)
    pooled_buf = cuda.allocate(4 * 8 * 8 * 8, "f32")
    engine = cuda.onnx().load(model, providers)
    got = engine.run({"img": (src, img.shape)}, ["logits"],
                     outputs={"pooled": (pooled_buf, (4, 8, 8, 8))})
    pooled = cuda.copy_to_numpy(pooled_buf, shape=(4, 8, 8, 8))
    cpu_out = cpu.onnx().load(model).run({"img": img})
    direct = ort.InferenceSession(model, providers=CPU).run(None, {"img": img})
    ref_logits, ref_pooled = convnet_reference(img, weights)
    assert_close(got["logits"], cpu_out["logits"])
    assert_close(pooled, cpu_out["pooled"])
    assert_close(got["logits"], direct[0])
    assert_close(pooled, direct[1])
    assert_close(got["logits"], ref_logits)
    assert_close(pooled, ref_pooled)


def test_bad_input_is_typed_on_cuda_too(devices: tuple[Any, Any],
                                        providers: list[str] | None) -> None:
    from atomr_accel import DTypeMismatch, InvalidArgument, LibraryError

    cuda, _ = devices
    model, weights = mlp(np.random.default_rng(6))
    engine = cuda.onnx().load(model, providers)
    with pytest.raises(DTypeMismatch):
        engine.run({"x": (cuda.allocate(32, "f64"), (2, 16))})
    with pytest.raises(InvalidArgument, match="no input"):
        engine.run({"q": np.ones((2, 16), np.float32)})
    out = cuda.allocate(64, "f32")
    with pytest.raises((InvalidArgument, LibraryError)) as caught:  # (2, 8) into (3, 8)
        engine.run({"x": np.ones((2, 16), np.float32)}, outputs={"y": (out, (3, 8))})
    print("an output buffer of the wrong batch:", type(caught.value).__name__, caught.value)
    x = np.random.default_rng(7).standard_normal((2, 16)).astype(np.float32)
    assert_close(engine.run({"x": x})["y"], mlp_reference(x, weights))
