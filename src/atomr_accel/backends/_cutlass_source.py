# ruff: noqa: E501  (the CUDA C++ below keeps its own line lengths)
"""The CUDA C++ of the cutlass library's kernels, rendered from a ``KernelPlan``.

Each source instantiates one CUTLASS kernel from the headers of the
``nvidia-cutlass`` package (``cutlass_library/source/include``) and wraps it in
a few ``extern "C"`` functions that ``_cutlass_build`` loads with ctypes:
``atomr_workspace`` (scratch bytes), ``atomr_run`` (build the arguments, check
``can_implement``, initialize and launch on the given stream; never
synchronizes; answers 0 or the step that failed), ``atomr_stages`` and
``atomr_smem_bytes`` (the kernel's pipeline depth and shared-memory footprint);
a GEMM's also ``atomr_prepare``, ``atomr_launch`` and ``atomr_release`` (the
first three steps once for fixed operands, then only the launch).

- GEMM (``sm90`` family; ``_cutlass_source80`` renders the ``sm80`` one):
  CUTLASS 3.x ``GemmUniversal`` on Hopper (TMA, WGMMA, cooperative
  warp-specialized mainloop and epilogue, persistent tile scheduler) with the
  fused epilogue ``LinCombPer{Row,Col}BiasEltAct``: ``act(alpha * acc + bias +
  beta * C)``, the activation picked at run time (``AtomrAct``). TF32 operands
  must be K-major, so f32 GEMMs take ``B`` transposed (``LAYOUT_B``); ``A``,
  ``B``, ``C`` and ``D`` load 16-byte vectors (``plan.align`` elements).
- Grouped GEMM: the ptr-array ``GemmUniversal`` over a ``GroupProblemShape``;
  the per-group shapes, pointers and strides are uploaded into the workspace on
  the stream.
- Conv2d: CUTLASS 2.x ``ImplicitGemmConvolution`` (``DefaultConv2dFprop``,
  optimized iterators, strided), per-channel bias as a stride-0 ``C``.
"""

from __future__ import annotations

from string import Template

from atomr_accel.backends._cutlass_source80 import ACTIVATION, gemm_entry_points, render_sm80_gemm
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._cutlass_plan import KernelPlan, PlanKind

__all__ = ["render"]

_ELEMENT = {DType.F16: "cutlass::half_t", DType.BF16: "cutlass::bfloat16_t", DType.F32: "float"}
_FP8 = {"e4m3": "cutlass::float_e4m3_t", "e5m2": "cutlass::float_e5m2_t"}
_SCHEDULES = {
    "cooperative": ("KernelTmaWarpSpecializedCooperative", "TmaWarpSpecializedCooperative"),
    "pingpong": ("KernelTmaWarpSpecializedPingpong", "TmaWarpSpecialized"),
    "cooperative_fastaccum": ("KernelTmaWarpSpecializedCooperativeFP8FastAccum",
                              "TmaWarpSpecializedCooperative"),
}
"""A GEMM plan's ``schedule``: CUTLASS's mainloop and epilogue schedules (the fp8 ones
included: ``fastaccum`` keeps the sum in the tensor cores' fp8 accumulator)."""
_INSTRUCTION = {DType.F16: "16,8,16", DType.BF16: "16,8,16", DType.F32: "16,8,8"}

_GEMM = Template(r"""#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

$ACTIVATION
// The activation an epilogue argument picks.
template <class T>
struct AtomrAct {
  struct Arguments { int kind = 0; };
  CUTLASS_HOST_DEVICE T operator()(T const& x, Arguments const& a) const {
    return atomr_activation(x, a.kind);
  }
};
template <class T, int N>
struct AtomrAct<cutlass::Array<T, N>> {
  using Arguments = typename AtomrAct<T>::Arguments;
  CUTLASS_HOST_DEVICE cutlass::Array<T, N> operator()(cutlass::Array<T, N> const& x, Arguments const& a) const {
    return atomr_activation(x, a.kind);
  }
};

using ElementA = $ELEMENT_A;
using ElementB = $ELEMENT_B;
using ElementC = $ELEMENT;
using ElementD = $ELEMENT;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = $LAYOUT_B;
using LayoutC = cutlass::layout::RowMajor;
constexpr int Align = $ALIGN;
using TileShape = Shape<$TILE>;
using ClusterShape = Shape<$CLUSTER>;

using Fusion = cutlass::epilogue::fusion::$FUSION<
    AtomrAct, ElementD, ElementAcc, ElementD, ElementC, ElementAcc>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc,
    ElementC, LayoutC, Align, ElementD, LayoutC, Align,
    cutlass::epilogue::$EPI_SCHEDULE, Fusion>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    ElementA, LayoutA, Align, ElementB, LayoutB, Align, ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCount<$STAGES>,
    cutlass::gemm::$KERNEL_SCHEDULE>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
    Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

static typename Gemm::Arguments make_args(int m, int n, int k, const void* a, const void* b,
                                          const void* c, void* d, const void* bias, float alpha,
                                          float beta, int act, int sm_count) {
  auto sa = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideA{}, make_shape(m, k, 1));
  auto sb = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideB{}, make_shape(n, k, 1));
  auto sc = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideC{}, make_shape(m, n, 1));
  auto sd = cutlass::make_cute_packed_stride(typename Gemm::GemmKernel::StrideD{}, make_shape(m, n, 1));
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm, {m, n, k, 1},
      {static_cast<const ElementA*>(a), sa, static_cast<const ElementB*>(b), sb},
      {{}, static_cast<const ElementC*>(c), sc, static_cast<ElementD*>(d), sd}, hw};
  args.epilogue.thread.alpha = alpha;
  args.epilogue.thread.beta = beta;
  args.epilogue.thread.bias_ptr = static_cast<const ElementD*>(bias);
  args.epilogue.thread.activation.kind = act;
  return args;
}

extern "C" int atomr_stages() { return $STAGES; }
extern "C" size_t atomr_smem_bytes() { return sizeof(typename GemmKernel::SharedStorage); }

extern "C" size_t atomr_workspace(int m, int n, int k, int sm_count) {
  return Gemm::get_workspace_size(make_args(m, n, k, nullptr, nullptr, nullptr, nullptr, nullptr, 1.f, 0.f, 0, sm_count));
}

$ENTRY_POINTS
""")

_GROUPED = Template(r"""#include <cuda_runtime.h>
#include <vector>
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;

using Element = $ELEMENT;
using ElementAcc = float;
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = $LAYOUT_B;
using LayoutC = cutlass::layout::RowMajor;
constexpr int Align = 16 / sizeof(Element);
using TileShape = Shape<$TILE>;
using ClusterShape = Shape<$CLUSTER>;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementAcc,
    Element, LayoutC*, Align, Element, LayoutC*, Align,
    cutlass::epilogue::$EPI_SCHEDULE,
    cutlass::epilogue::fusion::LinearCombination<Element, ElementAcc>>::CollectiveOp;

using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, LayoutA*, Align, Element, LayoutB*, Align, ElementAcc, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCount<$STAGES>,
    cutlass::gemm::$KERNEL_SCHEDULE>::CollectiveOp;

using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideC = typename Gemm::GemmKernel::InternalStrideC;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

static size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

// The device-side tables: problem shapes, then A, B, C, D pointers, then the four strides.
struct Tables {
  size_t shapes, pa, pb, pc, pd, sa, sb, sc, sd, end;
  explicit Tables(int g) {
    shapes = 0;
    pa = round_up(shapes + g * sizeof(Shape3));
    pb = round_up(pa + g * sizeof(void*));
    pc = round_up(pb + g * sizeof(void*));
    pd = round_up(pc + g * sizeof(void*));
    sa = round_up(pd + g * sizeof(void*));
    sb = round_up(sa + g * sizeof(StrideA));
    sc = round_up(sb + g * sizeof(StrideB));
    sd = round_up(sc + g * sizeof(StrideC));
    end = round_up(sd + g * sizeof(StrideD));
  }
};

static typename Gemm::Arguments make_args(int groups, Shape3* dev_shapes, const Shape3* host_shapes,
                                          char* tables, float alpha, int sm_count) {
  Tables t(groups);
  cutlass::KernelHardwareInfo hw;
  hw.device_id = 0;
  hw.sm_count = sm_count;
  typename Gemm::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGrouped,
      {groups, dev_shapes, host_shapes},
      {reinterpret_cast<const Element**>(tables + t.pa), reinterpret_cast<StrideA*>(tables + t.sa),
       reinterpret_cast<const Element**>(tables + t.pb), reinterpret_cast<StrideB*>(tables + t.sb)},
      {{}, reinterpret_cast<const Element**>(tables + t.pc), reinterpret_cast<StrideC*>(tables + t.sc),
       reinterpret_cast<Element**>(tables + t.pd), reinterpret_cast<StrideD*>(tables + t.sd)},
      hw};
  args.epilogue.thread.alpha = alpha;
  args.epilogue.thread.beta = 0.f;
  args.epilogue.thread.dAlpha = {cute::_0{}, cute::_0{}, 0};
  args.epilogue.thread.dBeta = {cute::_0{}, cute::_0{}, 0};
  return args;
}

static std::vector<Shape3> shapes_of(int groups, const int* mnk) {
  std::vector<Shape3> shapes;
  for (int i = 0; i < groups; ++i) shapes.push_back({mnk[3 * i], mnk[3 * i + 1], mnk[3 * i + 2]});
  return shapes;
}

extern "C" size_t atomr_workspace(int groups, const int* mnk, int sm_count) {
  Tables t(groups);
  auto shapes = shapes_of(groups, mnk);
  auto args = make_args(groups, nullptr, shapes.data(), nullptr, 1.f, sm_count);
  return t.end + Gemm::get_workspace_size(args);
}

extern "C" int atomr_stages() { return $STAGES; }
extern "C" size_t atomr_smem_bytes() { return sizeof(typename GemmKernel::SharedStorage); }

// ptrs: groups x (A, B, D) device addresses. 0 on success; 1: cannot implement;
// 2: initialize failed; 3: launch failed; 4: table upload failed.
extern "C" int atomr_run(int groups, const int* mnk, const unsigned long long* ptrs, float alpha,
                         void* workspace, int sm_count, void* stream) {
  Tables t(groups);
  auto shapes = shapes_of(groups, mnk);
  std::vector<char> host(t.end, 0);
  for (int i = 0; i < groups; ++i) {
    int m = mnk[3 * i], n = mnk[3 * i + 1], k = mnk[3 * i + 2];
    reinterpret_cast<Shape3*>(host.data() + t.shapes)[i] = shapes[i];
    reinterpret_cast<unsigned long long*>(host.data() + t.pa)[i] = ptrs[3 * i];
    reinterpret_cast<unsigned long long*>(host.data() + t.pb)[i] = ptrs[3 * i + 1];
    reinterpret_cast<unsigned long long*>(host.data() + t.pc)[i] = ptrs[3 * i + 2];
    reinterpret_cast<unsigned long long*>(host.data() + t.pd)[i] = ptrs[3 * i + 2];
    reinterpret_cast<StrideA*>(host.data() + t.sa)[i] = cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1});
    reinterpret_cast<StrideB*>(host.data() + t.sb)[i] = cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1});
    reinterpret_cast<StrideC*>(host.data() + t.sc)[i] = cutlass::make_cute_packed_stride(StrideC{}, {m, n, 1});
    reinterpret_cast<StrideD*>(host.data() + t.sd)[i] = cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1});
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  char* tables = static_cast<char*>(workspace);
  if (cudaMemcpyAsync(tables, host.data(), t.end, cudaMemcpyHostToDevice, s) != cudaSuccess) return 4;
  auto args = make_args(groups, reinterpret_cast<Shape3*>(tables + t.shapes), shapes.data(), tables,
                        alpha, sm_count);
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (gemm.initialize(args, tables + t.end, s) != cutlass::Status::kSuccess) return 2;
  if (gemm.run(s) != cutlass::Status::kSuccess) return 3;
  return 0;
}
""")

_CONV = Template(r"""#include <cuda_runtime.h>
#include "cutlass/cutlass.h"
#include "cutlass/numeric_types.h"
#include "cutlass/conv/kernel/default_conv2d_fprop.h"
#include "cutlass/conv/device/implicit_gemm_convolution.h"
#include "cutlass/epilogue/thread/linear_combination.h"

using Element = $ELEMENT;
using ElementAcc = float;
using Layout = cutlass::layout::TensorNHWC;
constexpr int Align = 16 / sizeof(Element);
using EpilogueOp = cutlass::epilogue::thread::LinearCombination<
    Element, Align, ElementAcc, ElementAcc, cutlass::epilogue::thread::ScaleType::NoBetaScaling>;
using Kernel = typename cutlass::conv::kernel::DefaultConv2dFprop<
    Element, Layout, Element, Layout, Element, Layout, ElementAcc,
    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,
    cutlass::gemm::GemmShape<$TILE>, cutlass::gemm::GemmShape<$WARP>,
    cutlass::gemm::GemmShape<$INSTRUCTION>, EpilogueOp,
    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<>, $STAGES,
    cutlass::arch::OpMultiplyAdd, cutlass::conv::IteratorAlgorithm::kOptimized,
    cutlass::conv::StrideSupport::kStrided, Align, Align>::Kernel;
using Conv = cutlass::conv::device::ImplicitGemmConvolution<Kernel>;

static typename Conv::Arguments make_args(const int* dims, const void* x, const void* w,
                                          const void* bias, void* y, float alpha) {
  // dims: N H W C K R S P Q pad_h pad_w stride_h stride_w dilation_h dilation_w
  cutlass::conv::Conv2dProblemSize problem(
      {dims[0], dims[1], dims[2], dims[3]}, {dims[4], dims[5], dims[6], dims[3]},
      {dims[9], dims[9], dims[10], dims[10]}, {dims[11], dims[12]}, {dims[13], dims[14]},
      {dims[0], dims[7], dims[8], dims[4]}, cutlass::conv::Mode::kCrossCorrelation, 1);
  auto x_layout = Layout::packed({dims[0], dims[1], dims[2], dims[3]});
  auto w_layout = Layout::packed({dims[4], dims[5], dims[6], dims[3]});
  auto y_layout = Layout::packed({dims[0], dims[7], dims[8], dims[4]});
  return typename Conv::Arguments{
      problem,
      {static_cast<Element*>(const_cast<void*>(x)), x_layout},
      {static_cast<Element*>(const_cast<void*>(w)), w_layout},
      {static_cast<Element*>(const_cast<void*>(bias)), Layout::Stride(0)},
      {static_cast<Element*>(y), y_layout},
      {alpha}};
}

extern "C" int atomr_stages() { return $STAGES; }
extern "C" size_t atomr_smem_bytes() { return sizeof(typename Kernel::SharedStorage); }

extern "C" size_t atomr_workspace(const int* dims) {
  Conv conv;
  return conv.get_workspace_size(make_args(dims, nullptr, nullptr, nullptr, nullptr, 1.f));
}

// 0 on success; 1: cannot implement; 2: initialize failed; 3: launch failed.
extern "C" int atomr_run(const int* dims, const void* x, const void* w, const void* bias, void* y,
                         float alpha, void* workspace, void* stream) {
  auto args = make_args(dims, x, w, bias, y, alpha);
  Conv conv;
  if (conv.can_implement(args) != cutlass::Status::kSuccess) return 1;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (conv.initialize(args, workspace, s) != cutlass::Status::kSuccess) return 2;
  if (conv.run(s) != cutlass::Status::kSuccess) return 3;
  return 0;
}
""")


def _shape(values: tuple[int, int, int], underscore: bool) -> str:
    return ",".join(f"_{v}" if underscore else str(v) for v in values)


def render(plan: KernelPlan) -> str:
    """The CUDA C++ source of ``plan``'s kernel."""
    if plan.kind is PlanKind.GEMM and plan.family == "sm80":
        return render_sm80_gemm(plan)
    element = _ELEMENT[plan.dtype]
    if plan.kind is PlanKind.CONV2D:
        return _CONV.substitute(ELEMENT=element, TILE=_shape(plan.tile, False),
                                WARP=_shape(plan.warp, False),
                                INSTRUCTION=_INSTRUCTION[plan.dtype], STAGES=plan.stages)
    common = {
        "ELEMENT": element,
        "LAYOUT_B": "cutlass::layout::ColumnMajor" if plan.dtype is DType.F32
        else "cutlass::layout::RowMajor",
        "TILE": _shape(plan.tile, True),
        "CLUSTER": _shape(plan.cluster, True),
        "STAGES": plan.stages,
    }
    if plan.kind is PlanKind.GROUPED:
        return _GROUPED.substitute(
            common, EPI_SCHEDULE="PtrArrayTmaWarpSpecializedCooperative",
            KERNEL_SCHEDULE="KernelPtrArrayTmaWarpSpecializedCooperative")
    fusion = "LinCombPerRowBiasEltAct" if plan.bias_axis == "row" else "LinCombPerColBiasEltAct"
    operands = {"ELEMENT_A": element, "ELEMENT_B": element}
    schedules = _SCHEDULES["cooperative"]
    if plan.kind is PlanKind.GEMM_FP8:
        operands = {"ELEMENT_A": _FP8[plan.formats[0]], "ELEMENT_B": _FP8[plan.formats[1]],
                    "LAYOUT_B": "cutlass::layout::ColumnMajor"}
        schedules = _SCHEDULES[plan.schedule]
    return _GEMM.substitute(common, **operands, ACTIVATION=ACTIVATION, FUSION=fusion,
                            EPI_SCHEDULE=schedules[1],
                            KERNEL_SCHEDULE=schedules[0], ALIGN="16 / sizeof(ElementA)",
                            ENTRY_POINTS=gemm_entry_points("float"))
