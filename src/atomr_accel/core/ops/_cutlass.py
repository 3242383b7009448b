"""CUTLASS's kernel templates as ops (``library = "cutlass"``; the ``Cutlass`` handle).

- ``CutlassGemm``: ``D = epilogue(A @ B)`` for row-major ``A`` (``m x k``), ``B``
  (``k x n``) and ``D`` (``m x n``) of one dtype (f16, bf16, f32 computed in
  TF32 on tensor cores, or f64), accumulated in f32 (f64 for f64), with an
  ``Epilogue`` visitor tree; any sizes.
- ``CutlassGroupedGemm``: many GEMMs of different shapes in one launch (the MoE
  case), their operands packed one after another in three buffers.
- ``CutlassConv2d``: implicit-GEMM forward convolution, NHWC activations, KRSC
  filters, an NPQK output, optional per-channel bias and a scale.
- ``CutlassStats``: the device's kernel counters (launches, plans held).

A GEMM takes any ``m``, ``n`` and ``k``: its plan loads the widest vector
(at most 16 bytes) that ``k`` and ``n`` are multiples of. A convolution's
channels ``c`` and ``k`` must be multiples of ``16 / itemsize`` (8 for 16-bit
data, 4 for f32): its kernel loads 16-byte vectors. Grouped problems may have
any shape (a 1x1x1 problem, an empty one); the CUDA backend pads the few whose
``k`` or ``n`` is not a multiple of the vector through scratch copies.

An ``Epilogue`` is a chain of visitor nodes applied to the f32 accumulator, in
this order (each at most once): ``scale(alpha)``; ``bias(vector, axis)`` and
``residual_add(c, beta)`` (either order: they add); one activation (``relu``,
``gelu`` with erf, ``silu``); then ``reduce(out, axis)``, which sums the
stored ``D`` (its values as rounded to D's dtype) along rows or columns into an
f32 vector (f64 for an f64 GEMM). Rounding to D's dtype happens once, after the activation. That is
the tree CUTLASS's fused epilogue computes on CUDA,
``act(alpha * acc + bias + beta * C)``; other orders are refused.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, ClassVar

from atomr_accel.core._api import Form, Param
from atomr_accel.core._catalogue import declare
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import PickleByFields, pickle_by_name
from atomr_accel.core._op import (
    Op,
    is_int,
    require,
    require_buffer,
    require_dtype,
    require_len,
    require_nonneg,
    require_positive,
    require_same_dtype,
)
from atomr_accel.core._ref import GpuRef
from atomr_accel.core.ops._blaslt import _MatmulFields
from atomr_accel.core.ops._cutlass_plan import (
    CONV_DTYPES,
    FAMILIES,
    GEMM_DTYPES,
    GROUPED_DTYPES,
)

__all__ = [
    "Activation",
    "Axis",
    "BiasAdd",
    "CutlassConv2d",
    "CutlassGemm",
    "CutlassGroupedGemm",
    "CutlassStats",
    "Epilogue",
    "EpilogueNode",
    "Reduce",
    "ResidualAdd",
    "Scale",
    "Activate",
    "alignment",
]

declare("cutlass", "Cutlass",
        "CUTLASS kernels: fused-epilogue GEMM, grouped GEMM, implicit-GEMM conv2d.",
        rank=18, handle="Cutlass")


def alignment(dtype: DType) -> int:
    """Elements per 16-byte vector: what a convolution's ``c`` and ``k`` must be multiples of
    (and a grouped problem's ``k`` and ``n``, or the CUDA backend pads it)."""
    return 16 // dtype.itemsize


class Activation(enum.Enum):
    """An epilogue activation: ``identity``, ``relu``, ``gelu`` (erf form) or ``silu``."""

    IDENTITY = "identity"
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"

    __reduce_ex__ = pickle_by_name

    @property
    def code(self) -> int:
        """The number the kernels take for it."""
        return _ACTIVATION_CODES[self]


_ACTIVATION_CODES = {Activation.IDENTITY: 0, Activation.RELU: 1, Activation.GELU: 2,
                     Activation.SILU: 3}


class Axis(enum.Enum):
    """Where a vector lies along ``D``: ``row`` (one value per row, ``m`` values) or
    ``column`` (one per column, ``n`` values)."""

    ROW = "row"
    COLUMN = "column"

    __reduce_ex__ = pickle_by_name


def _ref(buffer: Any, name: str) -> GpuRef:
    ref = getattr(buffer, "ref", buffer)
    if not isinstance(ref, GpuRef):
        raise InvalidArgument(f"{name} must be a buffer, got {type(buffer).__name__}")
    return ref


def _axis(axis: Axis | str) -> Axis:
    try:
        return Axis(axis)
    except ValueError:
        raise InvalidArgument(f"axis must be 'row' or 'column', got {axis!r}") from None


@dataclass(frozen=True, slots=True)
class Scale(PickleByFields):
    """Multiply the accumulator by ``alpha``."""

    alpha: float


@dataclass(frozen=True, slots=True)
class BiasAdd(PickleByFields):
    """Add the vector ``bias`` (D's dtype) along ``axis``."""

    bias: GpuRef
    axis: Axis = Axis.COLUMN


@dataclass(frozen=True, slots=True)
class ResidualAdd(PickleByFields):
    """Add ``beta * C``, ``C`` an ``m x n`` row-major matrix of D's dtype."""

    c: GpuRef
    beta: float = 1.0


@dataclass(frozen=True, slots=True)
class Activate(PickleByFields):
    """Apply the activation ``fn``."""

    fn: Activation


@dataclass(frozen=True, slots=True)
class Reduce(PickleByFields):
    """Sum the stored ``D`` along ``axis`` into the vector ``out``, f32 (f64 for an f64
    ``D``) (``row``: one sum per row, ``m`` values; ``column``: one per column, ``n``)."""

    out: GpuRef
    axis: Axis = Axis.ROW


EpilogueNode = Scale | BiasAdd | ResidualAdd | Activate | Reduce
"""One node of an epilogue chain."""
_RANK: dict[type, int] = {Scale: 0, BiasAdd: 1, ResidualAdd: 1, Activate: 2, Reduce: 3}


@dataclass(frozen=True, slots=True)
class Epilogue(PickleByFields):
    """What a GEMM does with its accumulator before storing ``D``: a chain of visitor
    nodes, built by the methods below (each returns a new ``Epilogue``)::

        Epilogue().scale(0.5).bias(b).residual_add(c, beta=2.0).gelu().reduce(sums)

    An empty epilogue stores the accumulator as it is. The module docstring says
    which orders the fused kernel takes; ``validate`` refuses the others.
    """

    nodes: tuple[EpilogueNode, ...] = ()

    def _with(self, node: EpilogueNode) -> Epilogue:
        return Epilogue((*self.nodes, node))

    def scale(self, alpha: float) -> Epilogue:
        """Multiply the accumulator by ``alpha``."""
        return self._with(Scale(alpha))

    def bias(self, bias: Any, axis: Axis | str = Axis.COLUMN) -> Epilogue:
        """Add the vector ``bias`` along ``axis`` (``column``: ``n`` values, one per column)."""
        return self._with(BiasAdd(_ref(bias, "bias"), _axis(axis)))

    def residual_add(self, c: Any, beta: float = 1.0) -> Epilogue:
        """Add ``beta * C`` (an ``m x n`` matrix of D's dtype)."""
        return self._with(ResidualAdd(_ref(c, "c"), beta))

    def activation(self, fn: Activation | str) -> Epilogue:
        """Apply ``fn``: ``identity``, ``relu``, ``gelu`` or ``silu``."""
        try:
            act = Activation(fn)
        except ValueError:
            choices = ", ".join(repr(a.value) for a in Activation)
            raise InvalidArgument(f"activation must be one of {choices}, got {fn!r}") from None
        return self._with(Activate(act))

    def relu(self) -> Epilogue:
        """Apply ``max(x, 0)``."""
        return self.activation(Activation.RELU)

    def gelu(self) -> Epilogue:
        """Apply ``x * (1 + erf(x / sqrt(2))) / 2``."""
        return self.activation(Activation.GELU)

    def silu(self) -> Epilogue:
        """Apply ``x / (1 + exp(-x))``."""
        return self.activation(Activation.SILU)

    def reduce(self, out: Any, axis: Axis | str = Axis.ROW) -> Epilogue:
        """Also sum the stored ``D`` along ``axis`` into the vector ``out`` (f32; f64 for an
        f64 ``D``)."""
        return self._with(Reduce(_ref(out, "out"), _axis(axis)))

    def _node(self, kind: type[Any]) -> Any:
        for node in self.nodes:
            if type(node) is kind:
                return node
        return None

    @property
    def alpha(self) -> float:
        """The scale (1.0 without a ``scale`` node)."""
        node = self._node(Scale)
        return 1.0 if node is None else float(node.alpha)

    @property
    def bias_node(self) -> BiasAdd | None:
        """The ``bias`` node, if any."""
        node: BiasAdd | None = self._node(BiasAdd)
        return node

    @property
    def residual(self) -> ResidualAdd | None:
        """The ``residual_add`` node, if any."""
        node: ResidualAdd | None = self._node(ResidualAdd)
        return node

    @property
    def act(self) -> Activation:
        """The activation (``identity`` without one)."""
        node = self._node(Activate)
        return Activation.IDENTITY if node is None else node.fn

    @property
    def reduction(self) -> Reduce | None:
        """The ``reduce`` node, if any."""
        node: Reduce | None = self._node(Reduce)
        return node

    def refs(self) -> tuple[GpuRef, ...]:
        """The buffers the nodes name, in chain order."""
        out: list[GpuRef] = []
        for node in self.nodes:
            if isinstance(node, BiasAdd):
                out.append(node.bias)
            elif isinstance(node, ResidualAdd):
                out.append(node.c)
            elif isinstance(node, Reduce):
                out.append(node.out)
        return tuple(out)

    def validate(self) -> None:
        """Refuse a node that is not one of the five, a repeated kind, or an order the fused
        kernel does not compute (see the module docstring)."""
        if not isinstance(self.nodes, tuple):
            raise InvalidArgument(f"an epilogue's nodes must be a tuple, got {self.nodes!r}")
        seen: set[type] = set()
        last = -1
        for node in self.nodes:
            kind = type(node)
            rank = _RANK.get(kind)
            if rank is None:
                raise InvalidArgument(f"not an epilogue node: {node!r}")
            require(kind not in seen, f"an epilogue takes one {kind.__name__} node")
            require(rank >= last,
                    "the fused epilogue computes act(alpha * acc + bias + beta * C), then a "
                    f"reduction: {kind.__name__} cannot follow what comes before it")
            seen.add(kind)
            last = rank
        for node in self.nodes:
            if isinstance(node, Scale | ResidualAdd):
                value = node.alpha if isinstance(node, Scale) else node.beta
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise InvalidArgument(f"{type(node).__name__} takes a number, got {value!r}")

    def check(self, m: int, n: int, dtype: DType) -> None:
        """``validate``, then the buffers against an ``m x n`` output of ``dtype``."""
        self.validate()
        bias = self.bias_node
        if bias is not None:
            require(bias.bias.dtype is dtype, f"bias must be {dtype.value} like D, got "
                    f"{bias.bias.dtype.value}")
            require_len(bias.bias, m if bias.axis is Axis.ROW else n, "bias")
        residual = self.residual
        if residual is not None:
            require(residual.c.dtype is dtype, f"c must be {dtype.value} like D, got "
                    f"{residual.c.dtype.value}")
            require_len(residual.c, m * n, "c")
        reduction = self.reduction
        if reduction is not None:
            require_buffer(reduction.out, (reduction_dtype(dtype),),
                           m if reduction.axis is Axis.ROW else n, "the reduction output")


def reduction_dtype(dtype: DType) -> DType:
    """The dtype a reduction node sums a ``D`` of ``dtype`` into: f64 for f64, else f32."""
    return DType.F64 if dtype is DType.F64 else DType.F32


def _epilogue(value: Any) -> Epilogue:
    if value is None:
        return Epilogue()
    if not isinstance(value, Epilogue):
        raise InvalidArgument(f"epilogue must be an Epilogue, got {type(value).__name__}")
    return value


def _require_aligned(dtype: DType, **dims: int) -> None:
    step = alignment(dtype)
    for name, value in dims.items():
        require(value % step == 0,
                f"{name} ({value}) must be a multiple of {step} for {dtype.value} data "
                "(the kernels load 16-byte vectors)")


def _distinct(outputs: tuple[GpuRef, ...], inputs: tuple[GpuRef, ...]) -> None:
    ids = {(r.device_id, r.buffer_id) for r in inputs}
    for out in outputs:
        require((out.device_id, out.buffer_id) not in ids,
                "an output must not be one of the op's inputs")


_EPILOGUE = Param("epilogue", None, parse=_epilogue, annotation="Epilogue | None")


@dataclass(frozen=True, slots=True)
class _EpilogueGemm(_MatmulFields):
    """The leading fields (the fused matmuls' ``a``, ``b``, ``d``, ``m``, ``n``, ``k``, then
    ``epilogue``), buffers, epilogue checks and flop count of the GEMMs ``D =
    epilogue(A @ B)`` of ``m x k`` by ``k x n`` (``CutlassGemm``, ``CutlassGemmFp8``):
    a mixin, before ``Op``."""

    library: ClassVar[str] = "cutlass"
    outputs: ClassVar[tuple[str, ...]] = ("d",)
    epilogue: Epilogue = Epilogue()

    def refs(self) -> tuple[GpuRef, ...]:
        """``a``, ``b``, ``d``, then the epilogue's buffers."""
        return (self.a, self.b, self.d, *self.epilogue.refs())

    def writes(self) -> tuple[GpuRef, ...]:
        """``d``, and the reduction output if the epilogue has one."""
        reduction = self.epilogue.reduction
        return (self.d,) if reduction is None else (self.d, reduction.out)

    def _check_epilogue(self, dtype: DType) -> None:
        """Check the epilogue for an ``m x n`` D of ``dtype``; no output may be an input,
        nor the reduction output be d."""
        if not isinstance(self.epilogue, Epilogue):
            raise InvalidArgument(f"epilogue must be an Epilogue, got {self.epilogue!r}")
        self.epilogue.check(self.m, self.n, dtype)
        written = self.writes()
        require(len({(r.device_id, r.buffer_id) for r in written}) == len(written),
                "the reduction output must not be d")
        read = tuple(r for r in self.epilogue.refs() if r not in written)
        _distinct(written, (self.a, self.b, *read))

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice."""
        return 2 * self.m * self.n * self.k


@dataclass(frozen=True, slots=True)
class CutlassGemm(_EpilogueGemm, Op):
    """``D = epilogue(A @ B)``: row-major ``a`` (``m x k``), ``b`` (``k x n``) and ``d``
    (``m x n``), one dtype (f16, bf16; f32 runs in TF32; f64), f32 accumulation (f64 for
    f64); any sizes. ``epilogue``: an ``Epilogue`` (None: store the product). ``family``:
    the CUTLASS template family to run, ``sm80`` or ``sm90`` (None: the plan's choice for
    the device). ``d`` must not be an input."""

    api = (Form("gemm", ("a", "b", "d", "m", "n", "k", _EPILOGUE)),)
    family: str | None = None

    def validate(self) -> None:
        require_positive(m=self.m, n=self.n, k=self.k)
        dtype = require_same_dtype(a=self.a, b=self.b, d=self.d)
        require_dtype(self.a, GEMM_DTYPES, "a")
        require(self.family is None or self.family in FAMILIES,
                f"family must be None or one of {', '.join(FAMILIES)}, got {self.family!r}")
        require_len(self.a, self.m * self.k, "a")
        require_len(self.b, self.k * self.n, "b")
        require_len(self.d, self.m * self.n, "d")
        self._check_epilogue(dtype)


def _problems(value: Any) -> tuple[tuple[int, int, int], ...]:
    try:
        problems = tuple(tuple(p) for p in value)
    except TypeError:
        raise InvalidArgument("problems must be a sequence of (m, n, k) triples") from None
    for p in problems:
        if len(p) != 3 or not all(is_int(v) and v >= 0 for v in p):
            raise InvalidArgument(f"each problem must be an (m, n, k) of ints >= 0, got {p!r}")
    return tuple((int(m), int(n), int(k)) for m, n, k in problems)


@dataclass(frozen=True, slots=True)
class CutlassGroupedGemm(Op):
    """Grouped GEMM: for each problem ``i = (m, n, k)``, ``D_i = alpha * A_i @ B_i``, all in
    one kernel launch. ``a`` holds every ``A_i`` (``m x k``, row-major) one after another,
    ``b`` every ``B_i`` (``k x n``), ``d`` every ``D_i`` (``m x n``); f16 or bf16. Any
    shapes, empty ones included (``k = 0`` writes zeros)."""

    library: ClassVar[str] = "cutlass"
    outputs: ClassVar[tuple[str, ...]] = ("d",)
    api = (Form("grouped_gemm",
                ("a", "b", "d", Param("problems", parse=_problems,
                                      annotation="Sequence[tuple[int, int, int]]"))),)
    a: GpuRef
    b: GpuRef
    d: GpuRef
    problems: tuple[tuple[int, int, int], ...]
    alpha: float = 1.0

    def offsets(self) -> tuple[tuple[int, int, int], ...]:
        """Where each problem's ``A``, ``B`` and ``D`` start in their buffers (elements)."""
        out = []
        oa = ob = od = 0
        for m, n, k in self.problems:
            out.append((oa, ob, od))
            oa, ob, od = oa + m * k, ob + k * n, od + m * n
        return tuple(out)

    def totals(self) -> tuple[int, int, int]:
        """Elements of ``a``, ``b`` and ``d`` the problems use."""
        return (sum(m * k for m, _, k in self.problems), sum(k * n for _, n, k in self.problems),
                sum(m * n for m, n, _ in self.problems))

    @property
    def flops(self) -> int:
        """Multiply-adds of every problem, counted twice."""
        return sum(2 * m * n * k for m, n, k in self.problems)

    def validate(self) -> None:
        problems = _problems(self.problems)
        require(len(problems) > 0, "a grouped GEMM needs at least one problem")
        require_same_dtype(a=self.a, b=self.b, d=self.d)
        require_dtype(self.a, GROUPED_DTYPES, "a")
        ta, tb, td = self.totals()
        require_len(self.a, ta, "a")
        require_len(self.b, tb, "b")
        require_len(self.d, td, "d")
        _distinct((self.d,), (self.a, self.b))
        if not isinstance(self.alpha, int | float) or isinstance(self.alpha, bool):
            raise InvalidArgument(f"alpha must be a number, got {self.alpha!r}")


def conv_out(size: int, pad: int, dilation: int, filt: int, stride: int) -> int:
    """Output extent of one spatial dimension of a convolution."""
    return (size + 2 * pad - dilation * (filt - 1) - 1) // stride + 1


@dataclass(frozen=True, slots=True)
class CutlassConv2d(Op):
    """Implicit-GEMM forward convolution (cross-correlation):
    ``y[n, p, q, k] = alpha * sum_{r, s, c} x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c]
    * weight[k, r, s, c] + bias[k]`` with ``x`` NHWC (``n, h, w, c``), ``weight`` KRSC
    (``k, r, s, c``), ``y`` NPQK; f16, bf16 or f32 (TF32); ``c`` and ``k`` multiples of
    8 (16-bit) or 4 (f32); ``bias``: ``k`` values or None."""

    library: ClassVar[str] = "cutlass"
    outputs: ClassVar[tuple[str, ...]] = ("y",)
    api = (Form("conv2d", ("x", "weight", "y", "n", "h", "w", "c", "k", "r", "s")),)
    x: GpuRef
    weight: GpuRef
    y: GpuRef
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    pad: tuple[int, int] = (0, 0)
    stride: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    alpha: float = 1.0
    bias: GpuRef | None = None

    @property
    def out_hw(self) -> tuple[int, int]:
        """The output's ``(p, q)``."""
        return (conv_out(self.h, self.pad[0], self.dilation[0], self.r, self.stride[0]),
                conv_out(self.w, self.pad[1], self.dilation[1], self.s, self.stride[1]))

    @property
    def flops(self) -> int:
        """Multiply-adds counted twice."""
        p, q = self.out_hw
        return 2 * self.n * p * q * self.k * self.r * self.s * self.c

    def validate(self) -> None:
        require_positive(n=self.n, h=self.h, w=self.w, c=self.c, k=self.k, r=self.r,
                         s=self.s)
        for name in ("pad", "stride", "dilation"):
            value = getattr(self, name)
            require(isinstance(value, tuple) and len(value) == 2,
                    f"{name} must be a pair (height, width), got {value!r}")
        require_nonneg(pad_h=self.pad[0], pad_w=self.pad[1])
        require_positive(stride_h=self.stride[0], stride_w=self.stride[1],
                         dilation_h=self.dilation[0], dilation_w=self.dilation[1])
        dtype = require_same_dtype(x=self.x, weight=self.weight, y=self.y)
        require_dtype(self.x, CONV_DTYPES, "x")
        _require_aligned(dtype, c=self.c, k=self.k)
        p, q = self.out_hw
        require(p >= 1 and q >= 1, f"the output would be {p} x {q}: the filter does not fit")
        require_len(self.x, self.n * self.h * self.w * self.c, "x")
        require_len(self.weight, self.k * self.r * self.s * self.c, "weight")
        require_len(self.y, self.n * p * q * self.k, "y")
        if self.bias is not None:
            require(self.bias.dtype is dtype, f"bias must be {dtype.value} like y")
            require_len(self.bias, self.k, "bias")
        _distinct((self.y,), (self.x, self.weight) + (() if self.bias is None else (self.bias,)))
        if not isinstance(self.alpha, int | float) or isinstance(self.alpha, bool):
            raise InvalidArgument(f"alpha must be a number, got {self.alpha!r}")


@dataclass(frozen=True, slots=True)
class CutlassStats(Op):
    """The device's CUTLASS counters: ``(dispatched, plans)`` — kernels launched by the
    cutlass ops so far, and distinct kernel plans the device holds (each built or loaded
    once, then reused)."""

    library: ClassVar[str] = "cutlass"
