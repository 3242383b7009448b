"""OnnxEngine on the CPU backend against ONNX Runtime called directly and NumPy references;
TensorRt's typed refusals. The models are built here with ``onnx.helper`` (``_onnx_models``);
the ONNX tests skip cleanly where ``onnxruntime`` or ``onnx`` is missing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _onnx_models import convnet, convnet_reference, mlp, mlp_reference

from atomr_accel import (
    ContextPoisoned,
    DTypeMismatch,
    FaultKind,
    GpuRuntimeError,
    InvalidArgument,
    LibraryError,
    LibraryUnavailable,
    OnnxEngine,
    System,
    TensorRt,
    TrtEngine,
)
from atomr_accel.backends import _optional
from atomr_accel.patterns import DynamicBatchingServer

Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def ort() -> Any:
    pytest.importorskip("onnx")
    return pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def system(ort: Any) -> Iterator[System]:
    with System.open("onnx-test") as system:
        yield system


@pytest.fixture(scope="module")
def dev(system: System) -> Any:
    return system.spawn_device(mock=True)


@pytest.fixture(scope="module")
def mlp_model() -> tuple[bytes, dict[str, Arr]]:
    return mlp(np.random.default_rng(1))


@pytest.fixture(scope="module")
def engine(dev: Any, mlp_model: tuple[bytes, dict[str, Arr]]) -> OnnxEngine:
    return dev.onnx().load(mlp_model[0])  # type: ignore[no-any-return]


def direct(ort: Any, model: bytes, feed: dict[str, Arr]) -> list[Arr]:
    """ONNX Runtime called without us."""
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, feed)  # type: ignore[no-any-return]


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_mlp_equals_onnxruntime_and_numpy(ort: Any, engine: OnnxEngine,
                                          mlp_model: tuple[bytes, dict[str, Arr]],
                                          batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 16)).astype(np.float32)
    got = engine.run({"x": x})
    assert list(got) == ["y"] and got["y"].shape == (batch, 8)
    np.testing.assert_allclose(got["y"], direct(ort, mlp_model[0], {"x": x})[0], rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_allclose(got["y"], mlp_reference(x, mlp_model[1]), rtol=1e-4, atol=1e-4)


def test_host_inputs_of_other_libraries_are_read_by_their_indices(
        engine: OnnxEngine, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    x = np.random.default_rng(6).standard_normal((3, 16)).astype(np.float32)
    want = mlp_reference(x, mlp_model[1])
    for given in (np.asfortranarray(x), x[::-1][::-1], x.__dlpack__()):
        np.testing.assert_allclose(engine.run({"x": given})["y"], want, rtol=1e-4, atol=1e-4)
    torch = pytest.importorskip("torch")
    tensor = torch.tensor(x, requires_grad=True)
    np.testing.assert_allclose(engine.run({"x": tensor})["y"], want, rtol=1e-4, atol=1e-4)


def test_engine_describes_its_model(engine: OnnxEngine) -> None:
    assert engine.input_names == ["x"] and engine.output_names == ["y"]
    assert engine.info.inputs[0].shape == (None, 16) and engine.info.inputs[0].dtype == "float32"
    assert engine.providers == ("CPUExecutionProvider",)
    assert "OnnxEngine" in repr(engine)


def test_buffers_in_and_out(dev: Any, engine: OnnxEngine,
                            mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    x = np.random.default_rng(5).standard_normal((5, 16)).astype(np.float32)
    src = dev.allocate(90, "f32")  # longer than needed: the first 80 elements are the input
    dst = dev.allocate(40, "f32")
    dev.copy_from_numpy(src, np.concatenate([x.ravel(), np.full(10, 9.0, np.float32)]))
    answered = engine.run({"x": (src, (5, 16))}, outputs={"y": (dst, (5, 8))})
    assert answered == {}
    got = dev.copy_to_numpy(dst, shape=(5, 8))
    np.testing.assert_allclose(got, mlp_reference(x, mlp_model[1]), rtol=1e-4, atol=1e-4)
    both = engine.run({"x": (src, [5, 16])}, ["y"], outputs={})
    np.testing.assert_allclose(both["y"], got, rtol=1e-6)


def test_convnet_two_outputs(ort: Any, dev: Any) -> None:
    model, weights = convnet(np.random.default_rng(2))
    engine = dev.onnx().load(model)
    img = np.random.default_rng(3).standard_normal((3, 3, 8, 8)).astype(np.float32)
    got = engine.run({"img": img})
    logits, pooled = convnet_reference(img, weights)
    ort_logits, ort_pooled = direct(ort, model, {"img": img})
    np.testing.assert_allclose(got["logits"], ort_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["pooled"], ort_pooled, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["logits"], logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["pooled"], pooled, rtol=1e-4, atol=1e-4)
    into = dev.allocate(3 * 4 * 4 * 4, "f32")
    only = engine.run({"img": img}, ["logits"], outputs={"pooled": (into, (3, 4, 4, 4))})
    assert list(only) == ["logits"]
    np.testing.assert_allclose(dev.copy_to_numpy(into, shape=(3, 4, 4, 4)), pooled, rtol=1e-4,
                               atol=1e-4)


def test_load_from_a_path_and_a_model_proto(dev: Any, tmp_path: Path,
                                            mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    import onnx

    path = tmp_path / "mlp.onnx"
    path.write_bytes(mlp_model[0])
    x = np.random.default_rng(8).standard_normal((2, 16)).astype(np.float32)
    want = mlp_reference(x, mlp_model[1])
    for source in (str(path), path, onnx.load_from_string(mlp_model[0])):
        got = dev.onnx().load(source).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


BAD_CALLS = [
    (lambda e, d: e.run({"z": np.zeros((1, 16), np.float32)}), InvalidArgument, "no input 'z'"),
    (lambda e, d: e.run({}), InvalidArgument, "missing"),
    (lambda e, d: e.run({"x": np.ones((2, 16), np.float64)}), DTypeMismatch, "float64"),
    (lambda e, d: e.run({"x": np.ones((2, 15), np.float32)}), InvalidArgument, r"\(2, 15\)"),
    (lambda e, d: e.run({"x": np.ones(16, np.float32)}), InvalidArgument, "shape"),
    (lambda e, d: e.run({"x": np.ones((2, 16), np.float32)}, ["q"]), InvalidArgument,
     "no outputs"),
    (lambda e, d: e.run({"x": np.ones((2, 16), np.float32)}, "y"), InvalidArgument, "one str"),
    (lambda e, d: e.run({"x": (d.allocate(16, "f32"), (2, 16))}), InvalidArgument, "holds 16"),
    (lambda e, d: e.run({"x": d.allocate(32, "f32")}), InvalidArgument, "free dimension"),
    (lambda e, d: e.run({"x": (d.allocate(32, "i32"), (2, 16))}), DTypeMismatch, "int32"),
    (lambda e, d: e.run({"x": object()}), InvalidArgument, "not an array"),
    (lambda e, d: e.run({"x": np.ones((2, 16), np.float32)},
                        outputs={"y": (d.allocate(16, "f32"), (3, 8))}), InvalidArgument,
     "holds 16"),
    (lambda e, d: e.run({"x": np.ones((2, 16), np.float32)}, timeout_secs=-1), InvalidArgument,
     "timeout_secs"),
]


@pytest.mark.parametrize(("call", "error", "match"), BAD_CALLS)
def test_bad_input_is_typed_and_the_device_keeps_serving(
        dev: Any, engine: OnnxEngine, mlp_model: tuple[bytes, dict[str, Arr]], call: Any,
        error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call(engine, dev)
    x = np.random.default_rng(4).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(engine.run({"x": x})["y"], mlp_reference(x, mlp_model[1]),
                               rtol=1e-4, atol=1e-4)


def test_an_output_buffer_of_the_wrong_shape_is_refused_by_the_run(dev: Any,
                                                                    engine: OnnxEngine) -> None:
    out = dev.allocate(64, "f32")
    with pytest.raises(InvalidArgument, match="shape"):  # (3, 8) fits the model, not the batch
        engine.run({"x": np.ones((2, 16), np.float32)}, outputs={"y": (out, (3, 8))})


def test_a_bad_model_is_invalid_argument(dev: Any) -> None:
    with pytest.raises(InvalidArgument, match="onnxruntime refused"):
        dev.onnx().load(b"not a model")
    with pytest.raises(InvalidArgument, match="non-empty"):
        dev.onnx().load(b"")
    with pytest.raises(InvalidArgument, match="cannot read"):
        dev.onnx().load("/no/such/model.onnx")
    with pytest.raises(InvalidArgument, match="ModelProto"):
        dev.onnx().load(12)
    with pytest.raises(InvalidArgument, match="threads"):
        dev.onnx().load(b"model", threads=-1)
    with pytest.raises(InvalidArgument, match="spinning"):
        dev.onnx().load(b"model", spinning="yes")
    with pytest.raises(InvalidArgument, match="one str"):
        dev.onnx().load(b"model", providers="CPUExecutionProvider")


def test_session_options_give_the_same_answers(
        dev: Any, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    x = np.random.default_rng(10).standard_normal((9, 16)).astype(np.float32)
    want = mlp_reference(x, mlp_model[1])
    for threads, spinning in ((1, False), (2, True)):
        engine = dev.onnx().load(mlp_model[0], threads=threads, spinning=spinning)
        np.testing.assert_allclose(engine.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)


def test_the_model_is_reloaded_after_a_context_rebuild(
        system: System, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    dev = system.spawn_device(mock=True)
    engine = dev.onnx().load(mlp_model[0])
    x = np.random.default_rng(6).standard_normal((4, 16)).astype(np.float32)
    before = engine.run({"x": x})["y"]
    generation = dev.generation
    with pytest.raises(ContextPoisoned):
        dev.inject_fault(FaultKind.POISON)
    after = engine.run({"x": x})["y"]  # the new context has no session: loaded again
    assert dev.generation == generation + 1
    np.testing.assert_array_equal(after, before)


def test_a_process_context_runs_it_and_reloads_it_after_a_crash(
        system: System, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    dev = system.spawn_device(mock=True, isolation="process")
    engine = dev.onnx().load(mlp_model[0])
    x = np.random.default_rng(11).standard_normal((5, 16)).astype(np.float32)
    want = mlp_reference(x, mlp_model[1])
    src, dst = dev.allocate(80, "f32"), dev.allocate(40, "f32")
    dev.copy_from_numpy(src, x)
    engine.run({"x": (src, (5, 16))}, outputs={"y": (dst, (5, 8))})
    np.testing.assert_allclose(dev.copy_to_numpy(dst, shape=(5, 8)), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ContextPoisoned):
        dev.inject_fault(FaultKind.CRASH)  # the worker process dies with its sessions
    np.testing.assert_allclose(engine.run({"x": x})["y"], want, rtol=1e-4, atol=1e-4)
    assert dev.generation == 2


def test_close_drops_the_session(dev: Any, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    engine = dev.onnx().load(mlp_model[0])
    engine.close()
    with pytest.raises(InvalidArgument, match="closed"):
        engine.run({"x": np.ones((1, 16), np.float32)})


def test_batch_function_of_a_dynamic_batching_server(
        system: System, engine: OnnxEngine, mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    rows = np.random.default_rng(7).standard_normal((40, 16)).astype(np.float32)
    server = DynamicBatchingServer.spawn(system, engine.batch_fn(), max_batch=16, max_wait=0.01)

    async def ask_all() -> tuple[list[Any], Any]:
        answers = await asyncio.gather(*(server.submit(row, timeout=30) for row in rows))
        return answers, await server.stats()

    answers, stats = asyncio.run(ask_all())
    np.testing.assert_allclose(np.stack(answers), mlp_reference(rows, mlp_model[1]), rtol=1e-4,
                               atol=1e-4)
    server.stop()
    assert stats.completed == 40 and stats.batches < 40
    with pytest.raises(InvalidArgument, match="no tensor"):
        engine.batch_fn(output_name="nope")


def test_async_twins_from_a_foreign_event_loop(dev: Any, engine: OnnxEngine,
                                               mlp_model: tuple[bytes, dict[str, Arr]]) -> None:
    x = np.random.default_rng(9).standard_normal((2, 16)).astype(np.float32)

    async def use() -> Arr:
        loaded = await dev.onnx().load_async(mlp_model[0])
        assert await dev.onnx().is_available_async()
        return (await loaded.run_async({"x": x}))["y"]  # type: ignore[no-any-return]

    np.testing.assert_allclose(asyncio.run(use()), mlp_reference(x, mlp_model[1]), rtol=1e-4,
                               atol=1e-4)


def test_missing_onnxruntime_is_library_unavailable(
        dev: Any, mlp_model: tuple[bytes, dict[str, Arr]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(_optional.OPTIONAL, "onnx",
                        _optional.Optional("onnxruntime_absent_here", "onnxruntime", "onnx"))
    with pytest.raises(LibraryUnavailable, match="onnxruntime") as caught:
        dev.onnx().load(mlp_model[0])
    assert caught.value.extra == "onnx"
    assert dev.onnx().is_available() is False


def test_the_library_can_be_left_out(system: System) -> None:
    dev = system.spawn_device(mock=True, libraries=("blas",))
    with pytest.raises(InvalidArgument, match="onnx library is not enabled"):
        dev.onnx()


# ------------------------------------------------------------------ TensorRT


def test_tensorrt_is_unavailable_and_every_call_says_so() -> None:
    assert TensorRt.is_available() is False and TensorRt.runtime_ready() is False
    assert "tensorrt" in TensorRt.unavailable_reason()
    calls = [lambda: TensorRt.load_engine("model.plan"),
             lambda: TensorRt.build_engine_from_onnx("m.onnx", "m.plan", fp16=True),
             lambda: TrtEngine("model.plan")]
    for call in calls:
        with pytest.raises(LibraryError, match="tensorrt") as caught:
            call()
        assert isinstance(caught.value, GpuRuntimeError)
        if isinstance(caught.value, LibraryUnavailable):
            assert caught.value.package == "tensorrt" and caught.value.extra == "tensorrt"
