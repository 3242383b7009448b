"""Options are checked against the types their ops declare, and sizes take any integer.

A bool option must be a bool and an enum option one of its choices
(``InvalidArgument`` naming them), for every op; an unknown keyword option is
an ``InvalidArgument``; NumPy integers are accepted as sizes, lengths,
offsets and counts (bools and floats are not) and reach the backend as ints.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import typing
from collections.abc import Iterator

import numpy as np
import pytest
from test_op_validation_speed import EXAMPLES

from atomr_accel import Device, InvalidArgument, System
from atomr_accel.core._op import checked
from atomr_accel.core.ops._blas import Gemm

HOSTS = ["thread", "process"]


@pytest.fixture(scope="module", params=HOSTS)
def dev(request: pytest.FixtureRequest) -> Iterator[Device]:
    with System.open("options") as system:
        yield system.spawn_device(mock=True, isolation=request.param)


def test_a_string_for_a_bool_option_is_refused(dev: Device) -> None:
    blas = dev.blas()
    a, x, y = dev.allocate_f32(4), dev.allocate_f32(2), dev.allocate_f32(2)
    with pytest.raises(InvalidArgument, match=r"^trans must be True or False, got 'Z'$"):
        blas.gemv(2, 2, a, x, y, trans="Z")
    c = dev.allocate_f32(4)
    with pytest.raises(InvalidArgument, match=r"^upper must be True or False, got 'Z'$"):
        blas.syrk(2, 2, a, c, upper="Z")
    blas.syrk(2, 2, a, c, upper=np.True_)  # a NumPy bool is a bool


def test_an_unknown_option_is_refused(dev: Device) -> None:
    a, x, y = dev.allocate_f32(4), dev.allocate_f32(2), dev.allocate_f32(2)
    with pytest.raises(InvalidArgument, match=r"Gemv takes no option 'transpose'.*trans"):
        dev.blas().gemv(2, 2, a, x, y, transpose=True)
    with pytest.raises(InvalidArgument, match=r"^Potrf takes no option 'lower'"):
        dev.solver().potrf(a, 2, lower=True)


def test_an_unknown_fault_kind_names_the_choices(dev: Device) -> None:
    with pytest.raises(InvalidArgument, match=r"'poison', 'oom'.*'bogus'"):
        dev.inject_fault("bogus")


def test_numpy_integers_are_sizes_and_reach_the_backend_as_ints(dev: Device) -> None:
    n = np.int64(3)
    a = dev.allocate(np.int32(9), "f64")
    assert len(a) == 9 and type(len(a)) is int
    data = np.arange(9.0)
    dev.copy_from_numpy(a, data[:3], offset=np.int64(6))
    got = dev.copy_to_numpy(a, offset=np.uint8(6), length=n)
    np.testing.assert_array_equal(got, data[:3])
    b, c = dev.allocate_f64(9), dev.allocate_f64(9)
    dev.copy_from_numpy(b, np.eye(3).reshape(-1))
    dev.blas().gemm(a, b, c, n, n, n, lda=np.int16(3))
    np.testing.assert_array_equal(dev.copy_to_numpy(c), dev.copy_to_numpy(a))
    dev.copy(a, c, length=np.int64(2), src_offset=np.int64(1))
    dev.rng(np.uint64(7)).uniform(b, length=np.int64(4))


@pytest.mark.parametrize("size", [True, 2.0, np.float64(2.0), "2"])
def test_bools_and_floats_are_not_sizes(dev: Device, size: object) -> None:
    with pytest.raises(InvalidArgument):
        dev.allocate(size, "f32")  # type: ignore[arg-type]


def _declared(op: object, name: str) -> object:
    return typing.get_type_hints(type(op))[name]


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: type(op).__name__)
def test_every_bool_and_enum_option_of_every_op_is_checked(op: object) -> None:
    """A wrong value in each bool or enum field is refused before the op's own checks."""
    checked(op)
    for field in dataclasses.fields(op):  # type: ignore[arg-type]
        hint = _declared(op, field.name)
        if hint in (bool, bool | None):
            wrong: object = "Z"
            message = rf"^{field.name} must be True or False, got 'Z'$"
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            wrong, message = "bogus", rf"^{field.name} must be one of .*got 'bogus'$"
        else:
            continue
        with pytest.raises(InvalidArgument, match=message):
            checked(dataclasses.replace(op, **{field.name: wrong}))  # type: ignore[type-var]


def test_an_op_checked_again_is_the_same_object_and_a_refusal_is_never_remembered(
        dev: Device) -> None:
    """``checked`` remembers an op of plain parts: an equal op of values of the same exact
    types is the op it made; a value of another type that compares equal (``True`` for
    ``1``, ``1+0j`` for ``1.0``) is checked on its own, and an op refused once is refused
    every time."""
    a, b, c = (dev.allocate_f32(4) for _ in range(3))
    blas = dev.blas()
    first = checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, alpha=1.0))
    assert checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, alpha=1.0)) is first
    assert checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, alpha=2.0)) is not first
    for _ in range(2):
        with pytest.raises(InvalidArgument, match="must be a real number"):
            checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, alpha=1 + 0j))
        with pytest.raises(InvalidArgument, match="must be a real number"):
            checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, alpha=True))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="must be True or False"):
            checked(Gemm(a.ref, b.ref, c.ref, 2, 2, 2, trans_a=1))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="leading dimension"):
            blas.gemm(a, b, c, 2, 2, 2, lda=1)
    data = np.arange(4.0, dtype=np.float32)
    dev.copy_from_numpy(a, data)
    dev.copy_from_numpy(b, np.eye(2, dtype=np.float32).reshape(-1))
    for scale in (1.0, 3.0, 1.0):  # the remembered op runs with this call's values
        blas.gemm(a, b, c, 2, 2, 2, alpha=scale)
        np.testing.assert_array_equal(dev.copy_to_numpy(c), scale * data)


def test_a_repeated_call_through_a_handle_makes_no_new_op(
        dev: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handle's method called again with equal values of the same exact types takes the
    op the memo holds (made and checked once); another value, or one of another type that
    compares equal, makes and checks its own; every call computes with its own data."""
    from atomr_accel.core._hit_rate import HitRate
    from atomr_accel.core._op import _declared

    monkeypatch.setattr(_declared(Gemm), "rate", HitRate())  # whatever ran before here
    made: list[tuple[object, ...]] = []
    init = Gemm.__init__

    def counting(self: Gemm, *args: object, **kwargs: object) -> None:
        made.append(args)
        init(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Gemm, "__init__", counting)
    a, b, c = (dev.allocate_f32(4) for _ in range(3))
    blas = dev.blas()
    dev.copy_from_numpy(b, np.eye(2, dtype=np.float32).reshape(-1))
    for round_, scale in enumerate((1.0, 1.0, 3.0, 1.0, 3.0)):
        data = np.arange(4.0, dtype=np.float32) + round_
        dev.copy_from_numpy(a, data)
        blas.gemm(a, b, c, 2, 2, 2, alpha=scale)
        np.testing.assert_array_equal(dev.copy_to_numpy(c), scale * data)
    assert len(made) == 2  # alpha 1.0, then 3.0: each made once
    with pytest.raises(InvalidArgument, match="must be a real number"):
        blas.gemm(a, b, c, 2, 2, 2, alpha=True)  # equal to 1, made and refused
    assert len(made) == 3
    asyncio.run(blas.gemm_async(a, b, c, 2, 2, 2, alpha=3.0))
    np.testing.assert_array_equal(dev.copy_to_numpy(c), 3.0 * data)
    assert len(made) == 3


def test_an_op_with_shape_tuples_is_remembered_only_when_they_hold_plain_ints(
        dev: Device) -> None:
    """A convolution (its shapes, pad and stride are tuples of ints) checked again is the op
    checked before; a tuple holding a NumPy integer is checked on its own (and made plain),
    and one holding a bool or a float, equal to the remembered one, is refused every time."""
    from atomr_accel.core.ops._dnn import Conv2dForward

    x, w, y = dev.allocate_f32(2 * 3 * 5 * 5), dev.allocate_f32(4 * 3 * 3 * 3), \
        dev.allocate_f32(2 * 4 * 5 * 5)

    def conv(pad: tuple[object, ...] = (1, 1), y_shape: tuple[int, ...] = (2, 4, 5, 5)
             ) -> Conv2dForward:
        return Conv2dForward(x.ref, w.ref, y.ref, (2, 3, 5, 5), (4, 3, 3, 3), y_shape,
                             pad=pad)  # type: ignore[arg-type]

    first = checked(conv())
    assert checked(conv()) is first
    made = checked(conv(pad=(np.int64(1), 1)))
    assert made is not first and made == first
    assert [type(v) for v in made.pad] == [int, int]
    for _ in range(2):  # equal to (1, 1), and refused each time
        with pytest.raises(InvalidArgument, match="pad must be two ints"):
            checked(conv(pad=(True, 1)))
        with pytest.raises(InvalidArgument, match="pad must be two ints"):
            checked(conv(pad=(1.0, 1)))
        with pytest.raises(InvalidArgument, match="y_shape"):
            checked(conv(y_shape=(2, 4, 4, 4)))


def test_a_kind_of_op_whose_values_keep_changing_is_not_remembered_for_a_while() -> None:
    """``checked`` stops looking ops of a kind up once a whole trial of them found nothing
    (an RNG fill's offset changes every call); another kind is remembered as before."""
    from atomr_accel.core._dtype import DType
    from atomr_accel.core._hit_rate import HitRate
    from atomr_accel.core._op import remembered
    from atomr_accel.core._ref import GpuRef
    from atomr_accel.core.ops._blas_vectors import Axpy, Scal

    x, y = GpuRef(0, 91, DType.F64, 8, 1, 5), GpuRef(0, 92, DType.F64, 8, 1, 5)
    assert remembered(Axpy(8, 0.5, x, y))
    for i in range(2 * HitRate.TRIAL + 1):
        checked(Axpy(8, 1.0 + i, x, y))
    assert not remembered(Axpy(8, 0.5, x, y))
    assert checked(Axpy(8, 0.5, x, y)) is not checked(Axpy(8, 0.5, x, y))  # resting
    with pytest.raises(InvalidArgument):
        checked(Axpy(8, 1j, x, y))  # still checked
    scal = checked(Scal(8, 2.0, x))
    assert checked(Scal(8, 2.0, x)) is scal and remembered(scal)
