# ruff: noqa: E501  (the CUDA C++ below keeps its own line lengths)
"""The CUDA C++ of the ``sm80`` family's GEMM, rendered from a ``KernelPlan``.

CUTLASS 2.x ``GemmUniversal`` (``DefaultGemmWithVisitor``: ``arch::Sm80``,
``OpClassTensorOp``; ``cp.async`` multistage mainloop, or the two-stage
pipelined one for 2-byte loads) with the epilogue as a CUTLASS 2.x visitor
tree (``Sm80EVT``): ``act(alpha * acc + bias + beta * C)`` stored as ``D``,
all row-major. The bias is a row broadcast (one value per column) or a
column broadcast (one per row), a null pointer adding nothing; ``beta``,
``alpha`` and the activation are broadcast scalars read at run time
(``AtomrResidual`` skips ``C`` where ``beta`` is 0, so unwritten memory
never leaks in; ``AtomrAct`` picks the activation). Every architecture from
``sm_80`` on runs it; f16 / bf16 use 16x8x16 ``mma.sync``, f32 TF32 16x8x8,
f64 DMMA 8x8x4. The ``extern "C"`` entry points are those of the Hopper
GEMM (``_cutlass_source``), with ``alpha`` and ``beta`` as doubles.
"""

from __future__ import annotations

from string import Template

from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._cutlass_plan import KernelPlan

__all__ = ["ACTIVATION", "gemm_entry_points", "render_sm80_gemm"]

_ELEMENT = {DType.F16: "cutlass::half_t", DType.BF16: "cutlass::bfloat16_t", DType.F32: "float",
            DType.F64: "double"}
_INSTRUCTION = {DType.F16: "16,8,16", DType.BF16: "16,8,16", DType.F32: "16,8,8",
                DType.F64: "8,8,4"}
_BIAS = {"column": "evt::VisitorRowBroadcast<OutputTileThreadMap, Element, Stride<_0, _1, int32_t>>",
         "row": "evt::VisitorColBroadcast<OutputTileThreadMap, Element, Stride<_1, _0, int32_t>>"}
_BIAS_STRIDE = {"column": "{_0{}, _1{}, int32_t(0)}", "row": "{_1{}, _0{}, int32_t(0)}"}

ACTIVATION = r"""// The activation picked at run time: 0 identity, 1 relu, 2 gelu (erf), 3 silu.
template <class T>
CUTLASS_HOST_DEVICE T atomr_activation(T const& x, int kind) {
  switch (kind) {
    case 1: return cutlass::epilogue::thread::ReLu<T>{}(x);
    case 2: return cutlass::epilogue::thread::GELU<T>{}(x);
    case 3: return cutlass::epilogue::thread::SiLu<T>{}(x);
    default: return x;
  }
}"""
"""The C++ function both GEMM families' epilogues (``AtomrAct``) apply, on a value or an
array of them."""

_GEMM = Template(r"""#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/default_gemm_universal_with_visitor.h"
#include "cutlass/epilogue/threadblock/fusion/visitors.hpp"
#include "cutlass/epilogue/thread/activation.h"

using namespace cute;
namespace evt = cutlass::epilogue::threadblock;

// x + beta * c; where beta is 0, x alone (C is not read into the sum).
template <class T> struct AtomrResidual;
template <class T, int N>
struct AtomrResidual<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x, cutlass::Array<T, N> const& c,
                                                      cutlass::Array<T, N> const& beta) const {
    if (beta[0] == T(0)) return x;
    return cutlass::multiply_add<cutlass::Array<T, N>>{}(beta, c, x);
  }
};
$ACTIVATION
// The activation a broadcast scalar picks.
template <class T> struct AtomrAct;
template <class T, int N>
struct AtomrAct<cutlass::Array<T, N>> {
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x, cutlass::Array<T, N> const& kind) const {
    return atomr_activation(x, static_cast<int>(kind[0]));
  }
};

using Element = $ELEMENT;
using ElementAcc = $COMPUTE;
using ElementCompute = $COMPUTE;
using LayoutR = cutlass::layout::RowMajor;
constexpr int Align = $ALIGN;
constexpr int Stages = $STAGES;
using TileShape = cutlass::gemm::GemmShape<$TILE>;
using WarpShape = cutlass::gemm::GemmShape<$WARP>;
using InstructionShape = cutlass::gemm::GemmShape<$INSTRUCTION>;
constexpr auto Round = cutlass::FloatRoundStyle::round_to_nearest;
using StrideMN = Stride<int64_t, _1, int64_t>;

using OutputTileThreadMap = evt::OutputTileThreadLayout<TileShape, WarpShape, Element, Align, 1>;
using Scalar = evt::VisitorScalarBroadcast<ElementCompute>;
using Bias = $BIAS;
using Scaled = evt::Sm80EVT<evt::VisitorCompute<cutlass::multiply_add, ElementCompute, ElementCompute, Round>,
                       Scalar, evt::VisitorAccFetch, Bias>;
using Summed = evt::Sm80EVT<evt::VisitorCompute<AtomrResidual, ElementCompute, ElementCompute, Round>,
                       Scaled, evt::VisitorAuxLoad<OutputTileThreadMap, Element, StrideMN>, Scalar>;
using Activated = evt::Sm80EVT<evt::VisitorCompute<AtomrAct, Element, ElementCompute, Round>, Summed, Scalar>;
using Callbacks = evt::Sm80EVT<evt::VisitorAuxStore<OutputTileThreadMap, Element, Round, StrideMN>, Activated>;

using GemmKernel = typename cutlass::gemm::kernel::DefaultGemmWithVisitor<
    Element, LayoutR, cutlass::ComplexTransform::kNone, Align,
    Element, LayoutR, cutlass::ComplexTransform::kNone, Align,
    Element, LayoutR, Align, ElementAcc, ElementCompute,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80, TileShape, WarpShape, InstructionShape,
    Callbacks, cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, Stages,
    cutlass::arch::OpMultiplyAdd, 1>::GemmKernel;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

static typename Gemm::Arguments make_args(int m, int n, int k, const void* a, const void* b,
                                          const void* c, void* d, const void* bias, double alpha,
                                          double beta, int act, int) {
  StrideMN mn{int64_t(n), _1{}, int64_t(0)};
  typename Callbacks::Arguments callbacks{
      {{{{{ElementCompute(alpha)}}, {}, {static_cast<const Element*>(bias), Element(0), $BIAS_STRIDE}, {}},
        {static_cast<Element*>(const_cast<void*>(c)), Element(0), mn},
        {{ElementCompute(beta)}}, {}},
       {{ElementCompute(act)}}, {}},
      {static_cast<Element*>(d), mn}};
  return typename Gemm::Arguments(cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k}, 1, callbacks,
                                  a, b, nullptr, nullptr, 0, 0, 0, 0, k, n, 0, 0);
}

extern "C" int atomr_stages() { return Stages; }
extern "C" size_t atomr_smem_bytes() { return sizeof(typename GemmKernel::SharedStorage); }

extern "C" size_t atomr_workspace(int m, int n, int k, int) {
  return Gemm::get_workspace_size(make_args(m, n, k, nullptr, nullptr, nullptr, nullptr, nullptr, 1.0, 0.0, 0, 0));
}

$ENTRY_POINTS""")


_ENTRY_POINTS = Template(r"""// 0 on success; 1: cannot implement; 2: initialize failed; 3: launch failed.
static int atomr_initialize(Gemm& gemm, int m, int n, int k, const void* a, const void* b,
                            const void* c, void* d, const void* bias, $SCALAR alpha, $SCALAR beta,
                            int act, void* workspace, int sm_count, void* stream) {
  auto args = make_args(m, n, k, a, b, c, d, bias, alpha, beta, act, sm_count);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (gemm.initialize(args, workspace, static_cast<cudaStream_t>(stream)) != cutlass::Status::kSuccess) return 2;
  return 0;
}

extern "C" int atomr_launch(void* prepared, void* stream) {
  return static_cast<Gemm*>(prepared)->run(static_cast<cudaStream_t>(stream)) == cutlass::Status::kSuccess ? 0 : 3;
}

extern "C" int atomr_run(int m, int n, int k, const void* a, const void* b, const void* c, void* d,
                         const void* bias, $SCALAR alpha, $SCALAR beta, int act, void* workspace,
                         int sm_count, void* stream) {
  Gemm gemm;
  int status = atomr_initialize(gemm, m, n, k, a, b, c, d, bias, alpha, beta, act, workspace, sm_count, stream);
  return status != 0 ? status : atomr_launch(&gemm, stream);
}

// A launch prepared once for fixed operands: the arguments built, checked and initialized
// (*status: 0, or the step that failed, as atomr_run answers); atomr_launch then only
// launches it, on any stream. Only for a kernel that needs no workspace (whose
// initialization a launch would otherwise repeat).
extern "C" void* atomr_prepare(int m, int n, int k, const void* a, const void* b, const void* c,
                               void* d, const void* bias, $SCALAR alpha, $SCALAR beta, int act,
                               void* workspace, int sm_count, void* stream, int* status) {
  Gemm* gemm = new Gemm();
  *status = atomr_initialize(*gemm, m, n, k, a, b, c, d, bias, alpha, beta, act, workspace, sm_count, stream);
  if (*status == 0) return gemm;
  delete gemm;
  return nullptr;
}

extern "C" void atomr_release(void* prepared) { delete static_cast<Gemm*>(prepared); }
""")


def gemm_entry_points(scalar: str) -> str:
    """The ``extern "C"`` entry points of a GEMM kernel of either family, its ``alpha`` and
    ``beta`` of C++ type ``scalar``: ``atomr_run`` (prepare and launch at once), and
    ``atomr_prepare`` / ``atomr_launch`` / ``atomr_release`` (a launch prepared once for
    fixed operands, launched again without building its arguments)."""
    return _ENTRY_POINTS.substitute(SCALAR=scalar)


def render_sm80_gemm(plan: KernelPlan) -> str:
    """The CUDA C++ source of an ``sm80``-family GEMM plan's kernel."""
    return _GEMM.substitute(
        ACTIVATION=ACTIVATION, ELEMENT=_ELEMENT[plan.dtype], COMPUTE="double" if plan.dtype is DType.F64 else "float",
        ALIGN=plan.align, STAGES=plan.stages, TILE=",".join(map(str, plan.tile)),
        WARP=",".join(map(str, plan.warp)), INSTRUCTION=_INSTRUCTION[plan.dtype],
        BIAS=_BIAS[plan.bias_axis], BIAS_STRIDE=_BIAS_STRIDE[plan.bias_axis],
        ENTRY_POINTS=gemm_entry_points("double"))
