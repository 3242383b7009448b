"""Smoke tests of an installed atomr-accel: one per layer, each against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from atomr_accel import ContextPoisoned, FaultKind, GpuRefStale, InvalidArgument, System
from atomr_accel.telemetry import trace_ops


def gemm(backend: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y`` on a fresh device of ``backend``."""
    n = x.shape[0]
    with System.open("smoke") as system:
        dev = system.spawn_device(mock=backend == "cpu")
        a, b, c = (dev.allocate_f32(n * n) for _ in range(3))
        dev.copy_from_numpy(a, x)
        dev.copy_from_numpy(b, y)
        dev.blas().matmul(a, b, c, n, n, n)
        return dev.copy_to_numpy(c, shape=(n, n))


def operands(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return (rng.standard_normal((n, n)).astype(np.float32),
            rng.standard_normal((n, n)).astype(np.float32))


def test_cpu_gemm_matches_numpy() -> None:
    x, y = operands(48)
    np.testing.assert_allclose(gemm("cpu", x, y), x.astype(np.float64) @ y, rtol=1e-4,
                               atol=1e-4)


def test_bad_input_is_a_typed_error_and_a_fault_is_recovered() -> None:
    with System.open("smoke") as system:
        dev = system.spawn_device(mock=True)
        buffer = dev.allocate_f32(8)
        with pytest.raises(InvalidArgument):
            dev.copy_from_numpy(buffer, np.ones(8))  # float64 into float32
        with pytest.raises(ContextPoisoned):
            dev.inject_fault(FaultKind.POISON)
        with pytest.raises(GpuRefStale):
            dev.copy_to_numpy(buffer)
        fresh = dev.allocate_f32(8)
        values = np.arange(8, dtype=np.float32) * 1.5
        dev.copy_from_numpy(fresh, values)
        np.testing.assert_array_equal(dev.copy_to_numpy(fresh), values)
        assert dev.stats().generation == 2


def test_op_spans_are_recorded() -> None:
    with System.open("smoke") as system:
        dev = system.spawn_device(mock=True)
        with trace_ops(dev) as tracer:
            buffer = dev.allocate_f32(16)
        dev.free(buffer)
    (span,) = tracer.spans
    assert span.op == "Allocate" and span.outcome == "ok"
    assert span.launched_ns is not None
    assert span.submitted_ns <= span.launched_ns <= span.completed_ns


@pytest.mark.gpu
def test_cuda_gemm_matches_the_cpu_backend() -> None:
    x, y = operands(256)
    np.testing.assert_allclose(gemm("cuda", x, y), gemm("cpu", x, y), rtol=1e-3, atol=1e-3)
