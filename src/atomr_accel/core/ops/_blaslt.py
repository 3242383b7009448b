"""cuBLASLt-shaped matmuls with fused epilogues (nvmath-python on CUDA, NumPy on CPU).

Matrices are dense and **row-major** (C-order), as NumPy and PyTorch keep
them: ``A`` is ``m x k`` (stored ``k x m`` when ``trans_a``), ``B`` is
``k x n`` (stored ``n x k`` when ``trans_b``) and ``D`` is ``m x n``. One
product ``P = alpha * op(A) @ op(B) + beta * C`` is computed, where ``C`` is
what ``d`` holds on entry (read only when ``beta != 0``), and the epilogue is
applied to it before ``D`` is written:

========================  ====================================================
forward (``FusedMatmul``)
``none``                  ``D = P``
``bias``                  ``D = P + bias`` (``bias`` has ``n`` elements: one per column)
``relu`` / ``gelu``       ``D = relu(P)`` / ``gelu(P)``
``bias_relu``             ``D = relu(P + bias)`` (also ``relu_bias``)
``bias_gelu``             ``D = gelu(P + bias)`` (also ``gelu_bias``)
backward (``FusedMatmulGrad``)
``drelu`` / ``dgelu``     ``D = P * relu'(Z)`` / ``P * gelu'(Z)``, ``Z`` read from ``aux``
``drelu_bgrad``           as ``drelu``, and ``bias_grad[j] = sum_i D[i, j]``
``dgelu_bgrad``           as ``dgelu``, and ``bias_grad[j] = sum_i D[i, j]``
``bgrada``                ``D = P``, and ``bias_grad[i] = sum_l op(A)[i, l]`` (``m`` elements)
``bgradb``                ``D = P``, and ``bias_grad[j] = sum_l op(B)[l, j]`` (``n`` elements)
========================  ====================================================

GELU is cuBLASLt's: the tanh approximation
``gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (PyTorch's
``gelu(approximate="tanh")``), on both backends.

**The auxiliary buffer** carries what a backward epilogue needs from its
forward pass, in cuBLASLt's own layout (so the same buffer serves both
backends): a forward ``relu``/``bias_relu`` with ``aux`` given writes a u8
bit mask, one row of ``relu_aux_ld(n)`` bytes per row of ``D``, bit ``j % 8``
of byte ``j // 8`` set where ``Z[i, j] > 0``; a forward ``gelu``/``bias_gelu``
writes ``Z`` itself (the GELU input, dtype of ``D``), one row of
``gelu_aux_ld(n)`` elements per row of ``D``. ``aux_len(epilogue, m, n)``
gives the buffer's size. The padding past column ``n`` is unspecified.

Dtypes: f32, f16 and bf16 (f64 as well, for float64 references on the CPU);
every matrix and vector shares the dtype of ``d``. Products accumulate in
f32 (f64 for f64 data). ``allow_tf32`` lets f32 products run on TF32 tensor
cores on CUDA (about 10 mantissa bits per product); the CPU ignores it.
fp8 is left out: cuBLASLt's fp8 matmuls need per-tensor scales and a
transposed-A layout that this row-major op does not express.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from atomr_accel.core._api import Form, Param, choice
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name
from atomr_accel.core._op import (
    Op,
    positive_ints,
    require,
    require_dtype,
    require_len,
    require_numbers,
    require_positive,
)
from atomr_accel.core._ref import GpuRef, same_buffer

__all__ = [
    "DTYPES",
    "Epilogue",
    "FusedMatmul",
    "FusedMatmulGrad",
    "aux_len",
    "gelu_aux_ld",
    "relu_aux_ld",
]

declare("blaslt", "BlasLt",
        "cuBLASLt-shaped matmuls with fused epilogues (bias, ReLU, GELU and their gradients).",
        rank=12, handle="BlasLt")

DTYPES = (DType.F32, DType.F16, DType.BF16, DType.F64)
"""The dtypes of fused matmuls (f64 for float64 references; CUDA is tested on the others)."""


class Epilogue(enum.StrEnum):
    """What a fused matmul applies to ``P = alpha * op(A) @ op(B) + beta * C`` (see the module)."""

    NONE = "none"
    BIAS = "bias"
    RELU = "relu"
    GELU = "gelu"
    BIAS_RELU = "bias_relu"
    BIAS_GELU = "bias_gelu"
    DRELU = "drelu"
    DGELU = "dgelu"
    DRELU_BGRAD = "drelu_bgrad"
    DGELU_BGRAD = "dgelu_bgrad"
    BGRADA = "bgrada"
    BGRADB = "bgradb"

    __reduce_ex__ = pickle_by_name

    @property
    def has_bias(self) -> bool:
        """True when the epilogue adds ``bias``."""
        return self in (Epilogue.BIAS, Epilogue.BIAS_RELU, Epilogue.BIAS_GELU)

    @property
    def activation(self) -> str | None:
        """``"relu"`` or ``"gelu"`` for the epilogues that apply one (or its gradient)."""
        return _ACTIVATION.get(self)

    @property
    def is_backward(self) -> bool:
        """True for the gradient epilogues (``FusedMatmulGrad``)."""
        return self in BACKWARD

    @property
    def bias_grad_len(self) -> str | None:
        """Which size ``bias_grad`` has (``"m"`` or ``"n"``), None when not written."""
        return _BIAS_GRAD.get(self)


_ACTIVATION = {
    Epilogue.RELU: "relu", Epilogue.BIAS_RELU: "relu", Epilogue.DRELU: "relu",
    Epilogue.DRELU_BGRAD: "relu", Epilogue.GELU: "gelu", Epilogue.BIAS_GELU: "gelu",
    Epilogue.DGELU: "gelu", Epilogue.DGELU_BGRAD: "gelu",
}
_BIAS_GRAD = {Epilogue.DRELU_BGRAD: "n", Epilogue.DGELU_BGRAD: "n", Epilogue.BGRADA: "m",
              Epilogue.BGRADB: "n"}
FORWARD = (Epilogue.NONE, Epilogue.BIAS, Epilogue.RELU, Epilogue.GELU, Epilogue.BIAS_RELU,
           Epilogue.BIAS_GELU)
"""The epilogues of ``FusedMatmul``."""
BACKWARD = (Epilogue.DRELU, Epilogue.DGELU, Epilogue.DRELU_BGRAD, Epilogue.DGELU_BGRAD,
            Epilogue.BGRADA, Epilogue.BGRADB)
"""The epilogues of ``FusedMatmulGrad``."""

_FORWARD_NAMES: dict[str | bool, Epilogue] = {e.value: e for e in FORWARD}
_FORWARD_NAMES.update({"default": Epilogue.NONE, "relu_bias": Epilogue.BIAS_RELU,
                       "gelu_bias": Epilogue.BIAS_GELU})
_BACKWARD_NAMES: dict[str | bool, Epilogue] = {e.value: e for e in BACKWARD}
_BACKWARD_NAMES.update({"bgrad_relu": Epilogue.DRELU_BGRAD, "bgrad_gelu": Epilogue.DGELU_BGRAD})

_forward_epilogue = choice("epilogue", _FORWARD_NAMES)
_backward_epilogue = choice("epilogue", _BACKWARD_NAMES)


def _round_up(value: int, base: int) -> int:
    return -(-value // base) * base


def relu_aux_ld(n: int) -> int:
    """Bytes per row of a ReLU bit mask for ``n`` columns: ``ceil(n / 8)`` rounded up to 16."""
    return _round_up(-(-n // 8), 16)


def gelu_aux_ld(n: int) -> int:
    """Elements per row of a GELU input for ``n`` columns: ``n`` rounded up to 8."""
    return _round_up(n, 8)


def aux_len(epilogue: Epilogue | str, m: int, n: int) -> int:
    """Elements of the ``aux`` buffer that ``epilogue`` reads or writes for an ``m x n`` ``D``:
    ``m * relu_aux_ld(n)`` (u8) for the ReLU ones, ``m * gelu_aux_ld(n)`` for the GELU ones."""
    kind = Epilogue(epilogue).activation
    if kind is None:
        raise InvalidArgument(f"epilogue {Epilogue(epilogue).value!r} takes no aux buffer")
    return m * (relu_aux_ld(n) if kind == "relu" else gelu_aux_ld(n))


def _require_vector(ref: GpuRef, dtype: DType, length: int, name: str) -> None:
    """Check a bias-like buffer: ``d``'s dtype and ``length`` elements."""
    if ref.dtype is not dtype:
        raise InvalidArgument(f"{name} has dtype {ref.dtype.value} but d has {dtype.value}")
    require_len(ref, length, name)


@dataclass(frozen=True, slots=True)
class _MatmulFields:
    """The leading fields of the row-major matmuls into a separate ``D`` (both fused
    matmuls, CUTLASS's GEMMs), the operands and sizes of ``op(A) @ op(B)``: A is ``m x k``,
    B ``k x n`` and D ``m x n``; a field group, below ``_Common`` and ``_EpilogueGemm``."""

    a: GpuRef
    b: GpuRef
    d: GpuRef
    m: int
    n: int
    k: int


@dataclass(frozen=True)
class _Options:
    """The scalars and flags both fused matmuls end with, after their epilogue's buffers
    (``_ForwardFields`` or ``_GradFields``)."""

    __slots__ = ()
    alpha: float = 1.0
    beta: float = 0.0
    trans_a: bool = False
    trans_b: bool = False
    allow_tf32: bool = False


@dataclass(frozen=True)
class _ForwardFields(_MatmulFields):
    """``FusedMatmul``'s fields after the leading ones: its epilogue, optional by default,
    and the buffers it may read (the bias) or write (the backward's aux)."""

    __slots__ = ()
    epilogue: Epilogue = Epilogue.NONE
    bias: GpuRef | None = None
    aux: GpuRef | None = None


@dataclass(frozen=True)
class _GradFields(_MatmulFields):
    """``FusedMatmulGrad``'s fields after the leading ones: its backward epilogue, which it
    must be given, the forward's aux it reads and the bias gradient it writes."""

    __slots__ = ()
    epilogue: Epilogue
    aux: GpuRef | None = None
    bias_grad: GpuRef | None = None


class _Common(_Options, _MatmulFields):
    """The library and checks both fused matmuls share, after their fields (``_Options``
    after ``_ForwardFields`` or ``_GradFields``): a mixin, first among an op's bases."""

    __slots__ = ()
    library: ClassVar[str] = "blaslt"
    epilogue: Epilogue
    aux: GpuRef | None

    def _check_matmul(self, allowed: tuple[Epilogue, ...], op: str) -> DType:
        m, n, k = self.m, self.n, self.k
        if not positive_ints(m, n, k):
            require_positive(m=m, n=n, k=k)
        if self.epilogue not in allowed:
            names = ", ".join(repr(e.value) for e in allowed)
            raise InvalidArgument(f"{op} takes the epilogues {names}, "
                                  f"not {self.epilogue.value!r}")
        require_dtype(self.d, DTYPES, "d")
        dtype = self.d.dtype
        for name, ref in (("a", self.a), ("b", self.b)):
            if ref.dtype is not dtype:
                raise InvalidArgument(f"{name} has dtype {ref.dtype.value} but d has "
                                      f"{dtype.value}")
        require_numbers(dtype, alpha=self.alpha, beta=self.beta)
        require_len(self.a, m * k, "a")
        require_len(self.b, k * n, "b")
        require_len(self.d, m * n, "d")
        for name, ref in (("a", self.a), ("b", self.b)):
            if same_buffer(ref, self.d):
                raise InvalidArgument(f"d must not share a buffer with {name}")
        return dtype

    def _check_aux(self, dtype: DType) -> None:
        aux = self.aux
        if aux is None:
            return
        kind = self.epilogue.activation
        if kind is None:
            raise InvalidArgument(f"epilogue {self.epilogue.value!r} takes no aux buffer")
        if kind == "relu" and aux.dtype is not DType.U8:
            raise InvalidArgument(f"a ReLU aux buffer holds a u8 bit mask, not {aux.dtype.value}")
        if kind == "gelu" and aux.dtype is not dtype:
            raise InvalidArgument(f"a GELU aux buffer has the dtype of d ({dtype.value}), "
                                  f"not {aux.dtype.value}")
        require_len(aux, aux_len(self.epilogue, self.m, self.n), "aux")
        for name, ref in (("a", self.a), ("b", self.b), ("d", self.d)):
            if same_buffer(ref, aux):
                raise InvalidArgument(f"aux must not share a buffer with {name}")


_FORM_PARAMS = ("a", "b", "d", "m", "n", "k")
_DTYPE_VARIANTS = (DType.F32, DType.F16, DType.BF16)


def _forms(name: str, epilogue: Param) -> tuple[Form, Form]:
    """An op's form for any float dtype and its dtype-suffixed twins."""
    params = (*_FORM_PARAMS, epilogue)
    return (Form(name, params, returns="str"),
            Form(name, params, returns="str", dtypes=_DTYPE_VARIANTS))


@dataclass(frozen=True, slots=True)
class FusedMatmul(_Common, _ForwardFields, Op):
    """Compute ``D = epilogue(alpha * op(A) @ op(B) + beta * C [+ bias])``, row-major.

    ``A`` is ``m x k``, ``B`` is ``k x n``, ``D`` is ``m x n`` (row-major;
    ``trans_a``/``trans_b``: the buffer holds the transpose). ``d`` holds ``C``
    on entry when ``beta != 0``. ``epilogue`` is ``"none"``, ``"bias"``,
    ``"relu"``, ``"gelu"`` (tanh approximation), ``"bias_relu"`` or
    ``"bias_gelu"``; ``bias`` (``n`` elements, one per column) is required by
    the bias epilogues. ``aux``, optional with an activation, receives what the
    backward epilogue needs (a ReLU bit mask or the GELU input; see
    ``aux_len``). Answers the implementation that ran: ``"numpy"`` or
    ``"nvmath"``.
    """

    queues_only: ClassVar[bool] = True
    outputs: ClassVar[tuple[str, ...]] = ("d", "aux")
    api = _forms("matmul", Param("epilogue", "none", parse=_forward_epilogue,
                                 annotation="str"))

    def validate(self) -> None:
        dtype = self._check_matmul(FORWARD, "matmul")
        bias = self.bias
        if self.epilogue.has_bias:
            require(bias is not None, f"epilogue {self.epilogue.value!r} needs a bias buffer")
            assert bias is not None
            _require_vector(bias, dtype, self.n, "bias")
            require(not same_buffer(bias, self.d), "d must not share a buffer with bias")
        elif bias is not None:
            raise InvalidArgument(f"epilogue {self.epilogue.value!r} takes no bias; "
                                  "use 'bias', 'bias_relu' or 'bias_gelu'")
        self._check_aux(dtype)


@dataclass(frozen=True, slots=True)
class FusedMatmulGrad(_Common, _GradFields, Op):
    """Compute ``D = alpha * op(A) @ op(B) + beta * C`` with a backward epilogue, row-major.

    Shapes and layout as ``FusedMatmul``. ``epilogue`` is ``"drelu"`` or
    ``"dgelu"`` (``D`` times the activation's derivative at the forward's
    ``Z``, read from ``aux`` as the forward wrote it for a ``D`` of the same
    ``m x n``), ``"drelu_bgrad"``/``"dgelu_bgrad"`` (also ``bias_grad[j] =
    sum_i D[i, j]``), ``"bgrada"`` (``bias_grad[i] = sum_l op(A)[i, l]``, ``m``
    elements) or ``"bgradb"`` (``bias_grad[j] = sum_l op(B)[l, j]``, ``n``
    elements). The activation gradients need ``k >= 2`` (cuBLASLt's rule).
    Answers ``"numpy"`` or ``"nvmath"``.
    """

    outputs: ClassVar[tuple[str, ...]] = ("d", "bias_grad")
    api = _forms("matmul_backward", Param("epilogue", parse=_backward_epilogue,
                                          annotation="str"))

    def validate(self) -> None:
        dtype = self._check_matmul(BACKWARD, "matmul_backward")
        epilogue = self.epilogue
        if epilogue.activation is not None:
            require(self.aux is not None,
                    f"epilogue {epilogue.value!r} reads the forward's aux buffer; pass aux")
            require(self.k >= 2, f"epilogue {epilogue.value!r} needs k >= 2, got {self.k}")
        self._check_aux(dtype)
        grad, size = self.bias_grad, epilogue.bias_grad_len
        if size is None:
            require(grad is None, f"epilogue {epilogue.value!r} writes no bias_grad")
            return
        require(grad is not None, f"epilogue {epilogue.value!r} writes bias_grad; pass it")
        assert grad is not None
        _require_vector(grad, dtype, self.m if size == "m" else self.n, "bias_grad")
        others = [("a", self.a), ("b", self.b), ("d", self.d)]
        if self.aux is not None:
            others.append(("aux", self.aux))
        for name, ref in others:
            if same_buffer(ref, grad):
                raise InvalidArgument(f"bias_grad must not share a buffer with {name}")
