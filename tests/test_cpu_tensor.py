"""CPU tensor contractions against broadcast-and-sum float64 references; validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atomr_accel.backends.cpu import CpuBackend
from atomr_accel.core import DType, GpuRef, InvalidArgument
from atomr_accel.core.ops._memory import Allocate, Download, Upload
from atomr_accel.core.ops._tensor import Contract

DTYPES = [DType.F32, DType.F64, DType.C64, DType.C128]
TOL = {DType.F32: 1e-4, DType.F64: 1e-10, DType.C64: 1e-4, DType.C128: 1e-10}
EXTENTS = {"a": 3, "b": 4, "c": 5, "d": 2, "e": 3, "i": 6, "j": 7, "k": 4, "X": 2}
SUBSCRIPTS = [
    "ij,jk->ik",
    "abc,cd->abd",
    "abcd,dbe->aec",
    "ij,ij->",
    "i,j->ij",
    "ab,bc->ca",
    "abc,bX->Xa",
    "abc,c->ab",
]


def _alloc(b: CpuBackend, dtype: DType, n: int) -> GpuRef:
    return GpuRef(0, b.execute(Allocate(dtype, n)), dtype, n, 0)


def _upload(b: CpuBackend, data: Any, dtype: DType) -> GpuRef:
    arr = np.ascontiguousarray(np.asarray(data).reshape(-1), dtype=dtype.numpy)
    ref = _alloc(b, dtype, arr.size)
    b.execute(Upload(ref, arr))
    return ref


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType) -> Any:
    x = rng.standard_normal(shape)
    x = x + 1j * rng.standard_normal(shape) if dtype.is_complex else x
    # Round to the buffer's precision so the reference sees the stored values.
    return x.astype(dtype.numpy).astype(np.complex128 if dtype.is_complex else np.float64)


def _reference(
    a: np.ndarray[Any, Any], a_modes: str, b: np.ndarray[Any, Any], b_modes: str, c_modes: str
) -> np.ndarray[Any, Any]:
    """Broadcast both operands over every label, multiply, sum the labels not in ``c_modes``."""
    labels = sorted(set(a_modes) | set(b_modes))

    def spread(x: np.ndarray[Any, Any], modes: str) -> np.ndarray[Any, Any]:
        order = sorted(range(len(modes)), key=lambda i: labels.index(modes[i]))
        x = np.transpose(x, order)
        shape = [x.shape[sorted(modes).index(m)] if m in modes else 1 for m in labels]
        return x.reshape(shape)

    full = spread(a, a_modes) * spread(b, b_modes)
    summed = tuple(i for i, m in enumerate(labels) if m not in c_modes)
    kept = [m for m in labels if m in c_modes]
    out = full.sum(axis=summed)
    return np.transpose(out, [kept.index(m) for m in c_modes])


def _close(got: np.ndarray[Any, Any], want: np.ndarray[Any, Any], dtype: DType) -> None:
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[dtype] * scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("subscripts", SUBSCRIPTS)
@pytest.mark.parametrize(("alpha", "beta"), [(1.0, 0.0), (0.5, 2.0), (-1.5, 1.0)])
def test_contract(dtype: DType, subscripts: str, alpha: float, beta: float) -> None:
    rng = np.random.default_rng(len(subscripts))
    b = CpuBackend()
    inputs, c_modes = subscripts.split("->")
    a_modes, b_modes = inputs.split(",")
    a_shape, b_shape, c_shape = (
        tuple(EXTENTS[m] for m in ms) for ms in (a_modes, b_modes, c_modes)
    )
    a, bt, c0 = (_random(rng, s, dtype) for s in (a_shape, b_shape, c_shape))
    c = _upload(b, c0, dtype)
    op = Contract(
        _upload(b, a, dtype), a_modes, a_shape, _upload(b, bt, dtype), b_modes, b_shape,
        c, c_modes, c_shape, alpha, beta,
    )
    op.validate()
    assert op.subscripts == subscripts
    assert b.execute(op) == "numpy.einsum"
    got = b.execute(Download(c))
    assert got.dtype == dtype.numpy
    want = alpha * _reference(a, a_modes, bt, b_modes, c_modes) + beta * c0
    _close(got, want.reshape(-1), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_abc_cd_matches_tensordot(dtype: DType) -> None:
    rng = np.random.default_rng(11)
    b = CpuBackend()
    a, bt = _random(rng, (3, 4, 5), dtype), _random(rng, (5, 6), dtype)
    c0 = _random(rng, (3, 4, 6), dtype)
    c = _upload(b, c0, dtype)
    b.execute(Contract(_upload(b, a, dtype), "abc", (3, 4, 5), _upload(b, bt, dtype), "cd",
                       (5, 6), c, "abd", (3, 4, 6), 2.0, -0.5))
    _close(b.execute(Download(c)), (2.0 * np.tensordot(a, bt, axes=(2, 0)) - 0.5 * c0).ravel(),
           dtype)


def test_contract_with_complex_scalars() -> None:
    rng = np.random.default_rng(12)
    b = CpuBackend()
    dtype = DType.C128
    a, bt, c0 = (_random(rng, s, dtype) for s in ((4, 3), (3, 2), (4, 2)))
    c = _upload(b, c0, dtype)
    b.execute(Contract(_upload(b, a, dtype), "ij", (4, 3), _upload(b, bt, dtype), "jk", (3, 2),
                       c, "ik", (4, 2), 1 - 1j, 0.5j))
    _close(b.execute(Download(c)), ((1 - 1j) * a @ bt + 0.5j * c0).ravel(), dtype)


def test_beta_zero_ignores_c_and_leaves_the_tail() -> None:
    b = CpuBackend()
    a = np.arange(6.0).reshape(2, 3)
    c = _upload(b, [np.nan] * 4 + [9.0], DType.F64)
    b.execute(Contract(_upload(b, a, DType.F64), "ij", (2, 3), _upload(b, np.ones(3), DType.F64),
                       "j", (3,), c, "i", (2,), 2.0, 0.0))
    np.testing.assert_array_equal(b.execute(Download(c))[2:], [np.nan, np.nan, 9.0])
    np.testing.assert_array_equal(b.execute(Download(c, length=2)), [6.0, 24.0])


def _op(**changes: Any) -> Contract:
    f = GpuRef(0, 1, DType.F64, 100, 0)
    g = GpuRef(0, 2, DType.F64, 100, 0)
    h = GpuRef(0, 3, DType.F64, 100, 0)
    fields: dict[str, Any] = dict(
        a=f, a_modes="ij", a_shape=(3, 4), b=g, b_modes="jk", b_shape=(4, 5),
        c=h, c_modes="ik", c_shape=(3, 5),
    )
    return Contract(**(fields | changes))


def _bad_cases() -> list[tuple[str, str, dict[str, Any]]]:
    f32 = GpuRef(0, 4, DType.F32, 100, 0)
    i32 = GpuRef(0, 5, DType.I32, 100, 0)
    short = GpuRef(0, 6, DType.F64, 11, 0)
    f64 = GpuRef(0, 1, DType.F64, 100, 0)
    return [
        ("digit label", "ASCII letters", {"a_modes": "i1", "a_shape": (3, 4)}),
        ("dash label", "ASCII letters", {"c_modes": "i-", "c_shape": (3, 5)}),
        ("non-ascii label", "ASCII letters", {"b_modes": "jé", "b_shape": (4, 5)}),
        ("repeated in a", "repeats", {"a_modes": "jj", "a_shape": (4, 4)}),
        ("repeated in c", "repeats", {"c_modes": "ii", "c_shape": (3, 3)}),
        ("modes not str", "must be a str", {"a_modes": ["i", "j"]}),
        ("too few extents", "has 1 extents", {"a_shape": (3,)}),
        ("list shape", "tuple", {"b_shape": [4, 5]}),
        ("zero extent", "positive", {"a_shape": (0, 4)}),
        ("negative extent", "positive", {"c_shape": (3, -5)}),
        ("shared extent differs", "mode 'j' has extent 6", {"b_shape": (6, 5)}),
        ("output extent differs", "mode 'k'", {"c_shape": (3, 6)}),
        ("output label unknown", "appear in neither", {"c_modes": "iz", "c_shape": (3, 2)}),
        ("a too short", "a needs 12", {"a": short}),
        ("c too short", "c needs 15", {"c": short}),
        ("dtype mismatch", "b has dtype f32", {"b": f32}),
        ("int dtype", "a has dtype i32", {"a": i32}),
        ("complex alpha on real", "alpha is complex", {"alpha": 2j}),
        ("str beta", "beta must be a number", {"beta": "1"}),
        ("c aliases a", "must not share", {"c": f64}),
    ]


@pytest.mark.parametrize(
    ("name", "match", "changes"), _bad_cases(), ids=[c[0] for c in _bad_cases()]
)
def test_validate_rejects(name: str, match: str, changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match=match):
        _op(**changes).validate()


def test_validate_accepts() -> None:
    op = _op()
    op.validate()
    assert op.refs() == (op.a, op.b, op.c)
    assert op.writes() == (op.c,)
    _op(c_modes="", c_shape=(), b_modes="kj", b_shape=(5, 4)).validate()
    _op(alpha=2 + 0j, beta=1).validate()
