"""The fast paths of op validation and pickling keep the behaviour of the plain code.

Validation tests plain values first and builds names and messages only when a
check fails; ``Matrix`` and ``Vector`` are named tuples, cheap to make on
every validate. Ops, refs and dtypes pickle to a builder and their field
values. These tests pin what those shortcuts must keep: the same ops
accepted, the same errors and messages (against a plain reference of the
checks), and pickle round trips that give equal objects of the same types.
No timings are asserted here.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import importlib
import inspect
import io
import itertools
import pickle
import pickletools
import pkgutil
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from op_examples import buf, collected

import atomr_accel.core.ops
from atomr_accel.core import DType, GpuRef, GraphRef, InvalidArgument, KernelRef
from atomr_accel.core._fields import PickleByFields
from atomr_accel.core._op import (
    Op,
    matrix_extent,
    positive_ints,
    require,
    require_dtype,
    require_len,
    require_nonneg,
    require_numbers,
    require_positive,
    require_same_dtype,
)
from atomr_accel.core.ops._attention import (
    AttnMask,
    MultiHeadAttnBackward,
    MultiHeadAttnForward,
    SdpaBackward,
    SdpaForward,
    SdpaSupport,
)
from atomr_accel.core.ops._blas import (
    FLOAT_DTYPES,
    Asum,
    Axpy,
    Copy,
    Dot,
    Geam,
    Gemm,
    GemmStridedBatched,
    Gemv,
    Ger,
    Iamax,
    Iamin,
    LinalgOp,
    Matrix,
    Nrm2,
    Rot,
    Scal,
    Swap,
    Syrk,
    Trsm,
    Vector,
    require_scalar,
)
from atomr_accel.core.ops._blaslt import Epilogue, FusedMatmul, FusedMatmulGrad
from atomr_accel.core.ops._collective import (
    CallKind,
    CollectiveCall,
    CommAbort,
    CommInit,
    ReduceOp,
    RunCollective,
)
from atomr_accel.core.ops._cutlass import (
    CutlassConv2d,
    CutlassGemm,
    CutlassGroupedGemm,
    CutlassStats,
)
from atomr_accel.core.ops._cutlass import Epilogue as CutlassEpilogue
from atomr_accel.core.ops._cutlass_fp8 import CutlassGemmFp8
from atomr_accel.core.ops._dlpack import AdoptArray, ExternalWrite, ViewBuffer
from atomr_accel.core.ops._dnn import (
    Activation,
    ActivationBackward,
    ActivationForward,
    Conv2dBackwardData,
    Conv2dBackwardFilter,
    Conv2dForward,
    DropoutBackward,
    DropoutForward,
    Layout,
    LrnForward,
    Pool2dBackward,
    Pool2dForward,
    PoolMode,
    SoftmaxBackward,
    SoftmaxForward,
    SoftmaxMode,
)
from atomr_accel.core.ops._faults import FaultKind, InjectFault
from atomr_accel.core.ops._fft import Fft, FftKind, FftMany
from atomr_accel.core.ops._function import (
    BufferArg,
    BuildResident,
    CallFunction,
    FreeResident,
    Packed,
    UserCode,
)
from atomr_accel.core.ops._graph import CaptureGraph, DestroyGraph, LaunchGraph, OpSequence
from atomr_accel.core.ops._ipc import BufferAddress, IpcGetHandle, IpcOpenHandle
from atomr_accel.core.ops._kernels import CompileKernel, LaunchKernel, LoadKernel, dim3
from atomr_accel.core.ops._libraries import LibraryAvailable
from atomr_accel.core.ops._memory import (
    Advice,
    Advise,
    Allocate,
    Attach,
    CopyBuffer,
    Download,
    Free,
    Location,
    MemoryInfo,
    Prefetch,
    Upload,
)
from atomr_accel.core.ops._norm import (
    BatchNorm,
    GroupNorm,
    InstanceNorm,
    LayerNorm,
    NormBwd,
    NormMode,
    NormPhase,
    RmsNorm,
)
from atomr_accel.core.ops._onnx import (
    DeviceTensor,
    LoadOnnxModel,
    OnnxModelInfo,
    OnnxTensorInfo,
    RunOnnxModel,
    UnloadOnnxModel,
)
from atomr_accel.core.ops._peer import (
    CanAccessPeer,
    EnablePeerAccess,
    ExportBuffer,
    ImportCopy,
    PeerSource,
)
from atomr_accel.core.ops._realtime_data import (
    BuildCsr,
    HashErase,
    HashInsert,
    HashLookup,
    HashTable,
)
from atomr_accel.core.ops._realtime_frames import (
    BlendFrames,
    BoxBlur,
    Correlate,
    FilterFrames,
    FrameStats,
    GaussianBlur,
    SobelMagnitude,
    Threshold,
)
from atomr_accel.core.ops._realtime_physics import (
    ClothStep,
    FluidAddSource,
    FluidDivergence,
    FluidStep,
    GridBuild,
    GridQuery,
    ParticleCompact,
    ParticleStep,
    fluid_scratch,
)
from atomr_accel.core.ops._rng import Distribution, RngFill
from atomr_accel.core.ops._rnn import RnnBwd, RnnDirection, RnnFwd, RnnMode
from atomr_accel.core.ops._solver import (
    Geqrf,
    Gesvd,
    GesvdBatched,
    GesvdjBatched,
    Getrf,
    GetrfBatched,
    Getrs,
    GetrsBatched,
    Orgqr,
    Potrf,
    PotrfBatched,
    Potrs,
    PotrsBatched,
    Syevd,
    SyevdBatched,
)
from atomr_accel.core.ops._sparse import CsrMatrix, CsrSpMM, CsrSpMV
from atomr_accel.core.ops._tensor import Contract
from atomr_accel.core.ops._topk import ScoreTopK, TopK
from atomr_accel.core.ops._train import (
    AdamUpdate,
    FillZeros,
    GradCheck,
    LayerNormBackward,
    LayerNormForward,
    LinearBackward,
    LinearForward,
    MseLoss,
    SgdUpdate,
    SoftmaxCrossEntropy,
)

F32, F64, C64, C128, I32 = DType.F32, DType.F64, DType.C64, DType.C128, DType.I32
F16, BF16, U8 = DType.F16, DType.BF16, DType.U8
F16, BF16 = DType.F16, DType.BF16


class _Int(int):
    """An int subclass: not a plain int, yet a valid size."""




def _outcome(fn: Callable[[], object]) -> str:
    try:
        return f"ok {fn()!r}"
    except Exception as error:
        return f"{type(error).__name__}: {error}"


# ------------------------------------------------------------ the int shortcuts


@pytest.mark.parametrize("value", [0, 1, 7, _Int(3), -1, True, False, 2.0, None, np.int64(2)])
def test_int_shortcuts_defer_to_the_detailed_checks(value: Any) -> None:
    assert positive_ints(value) == (type(value) is int and value >= 1)
    fits = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if fits and value >= 0:
        require_nonneg(size=value)
    else:
        with pytest.raises(InvalidArgument, match=r"^size must be a non-negative int, got "):
            require_nonneg(size=value)
    if fits and value >= 1:
        require_positive(size=value)
    else:
        with pytest.raises(InvalidArgument, match=r"^size must be a positive int, got "):
            require_positive(size=value)


def test_require_nonneg_names_the_first_bad_value() -> None:
    with pytest.raises(InvalidArgument, match=r"^b must be a non-negative int, got -1$"):
        require_nonneg(a=_Int(1), b=-1, c=-2)


@pytest.mark.parametrize(
    ("value", "dtype", "message"),
    [
        (1.5, F32, None),
        (2, F32, None),
        (1j, C64, None),
        (1j, F32, r"^alpha is complex \(1j\) but the data are f32$"),
        (True, C64, r"^alpha must be a number, got True$"),
        ("2", F32, r"^alpha must be a number, got '2'$"),
    ],
)
def test_require_numbers(value: object, dtype: DType, message: str | None) -> None:
    if message is None:
        require_numbers(dtype, alpha=value)
    else:
        with pytest.raises(InvalidArgument, match=message):
            require_numbers(dtype, alpha=value)


def test_dim3_shortcut_normalizes_like_the_general_path() -> None:
    assert dim3((4, 2, 1), "grid") == (4, 2, 1)
    assert dim3((_Int(4), 2, 1), "grid") == (4, 2, 1)
    assert dim3(3, "grid") == (3, 1, 1)
    with pytest.raises(InvalidArgument, match=r"^grid must be 1 to 3 positive ints, got \(1, 0"):
        dim3((1, 0, 1), "grid")


# ------------------------------------------------- one valid example of every op


class _RecordedEvent:
    """What ``ExternalWrite`` reads of a CUDA event: its handle and ``synchronize``."""

    ptr = 1

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def __repr__(self) -> str:
        return "_RecordedEvent()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RecordedEvent)

    def __hash__(self) -> int:
        return 1


def _csr(owner: int = 0) -> CsrMatrix:
    return CsrMatrix(buf(I32, 4, 11, owner), buf(I32, 5, 12, owner), buf(F32, 5, 13, owner),
                     3, 4, 5)


_KERNEL = KernelRef(0, 5, "axpy<float>", 3, owner=99, library="module", cache_hit=True)
_GRAPH = GraphRef(0, 7, 3, 99, (buf(F32, 8), buf(F32, 8, 2)), (buf(F32, 8, 2),), 2)
_TABLE = HashTable(buf(DType.U32, 8, 21), buf(U8, 24, 22), buf(U8, 16, 23), 8, 3, 2)
_STAGES = (Correlate((0.0, 1.0, 0.0, 1.0, -4.0, 1.0, 0.0, 1.0, 0.0)), GaussianBlur(1.5, 4),
           BoxBlur(5), SobelMagnitude(), Threshold(0.5, 0.0, 1.0))

EXAMPLES: list[Any] = [
    Gemm(buf(F32, 64), buf(F32, 64, 2), buf(F32, 64, 3), 8, 4, 2, trans_a=True, lda=3),
    GemmStridedBatched(buf(F32, 64), buf(F32, 64, 2), buf(F32, 64, 3), 2, 2, 2, 3, stride_a=0),
    Axpy(4, 2.0, buf(F32, 4), buf(F32, 10, 2), incy=-3),
    Dot(3, buf(C64, 3), buf(C64, 3, 2), conjugate=True),
    Nrm2(3, buf(F32, 9), 3),
    Scal(3, 0.5, buf(F64, 3)),
    Asum(2, buf(F32, 2)),
    Iamax(2, buf(F32, 4), 2),
    Iamin(3, buf(C128, 5), 2),
    Rot(3, buf(C64, 7), buf(C64, 3, 2), 0.6, 0.8j, incx=-3),
    Swap(2, buf(F64, 4), buf(F64, 2, 2), incx=2),
    Copy(3, buf(F32, 3), buf(F32, 5, 2), incy=-2),
    Gemv(3, 2, buf(C64, 6), buf(C64, 3, 2), buf(C64, 2, 3), alpha=1j, trans=True, conj=True),
    Ger(2, 3, buf(F32, 2), buf(F32, 3, 2), buf(F32, 6, 3)),
    Geam(3, 2, buf(F32, 6), buf(F32, 6, 2), buf(F32, 6, 3), trans_b=True, ldb=2),
    Syrk(3, 2, buf(F32, 6), buf(F32, 9, 2), upper=True),
    Trsm(2, 3, buf(F32, 9), buf(F32, 6, 2), left=False),
    Getrf(buf(F32, 12), buf(I32, 3, 2), 4, 3),
    Getrs(buf(F32, 16), buf(I32, 4, 2), buf(F32, 8, 3), 4, 2),
    Potrf(buf(F64, 9), 3, upper=True),
    Potrs(buf(F64, 9), buf(F64, 6, 2), 3, 2),
    Geqrf(buf(F32, 12), buf(F32, 3, 2), 4, 3),
    Orgqr(buf(F32, 12), buf(F32, 3, 2), 4, 3, 2),
    Gesvd(buf(F32, 12), buf(F32, 3, 2), None, buf(F32, 9, 3), 4, 3),
    Syevd(buf(C64, 9), buf(F32, 3, 2), 3),
    GetrfBatched(buf(F32, 18), buf(I32, 6, 2), 3, 2),
    GetrsBatched(buf(F32, 9), buf(I32, 6, 2), buf(F32, 12, 3), 3, 2, 2, stride_a=0),
    PotrfBatched(buf(C128, 18), 3, 2),
    PotrsBatched(buf(F32, 9), buf(F32, 6, 2), 3, 1, 2, stride_a=0),
    SyevdBatched(buf(F32, 18), buf(F32, 6, 2), 3, 2, vectors=False),
    GesvdBatched(buf(F32, 24), buf(F32, 6, 2), buf(F32, 32, 3), None, 4, 3, 2),
    GesvdjBatched(buf(C64, 24), buf(F32, 6, 2), buf(C64, 24, 3), buf(C64, 23, 4), 4, 3, 2,
                  ldv=4, info=buf(I32, 2, 5)),
    InjectFault(FaultKind.OOM, 0.5),
    Fft(buf(F32, 16), buf(C64, 10, 2), (2, 8), FftKind.R2C),
    FftMany(buf(F32, 64), buf(C64, 45, 2), 2, (2, 8), FftKind.R2C, None, 2, (3, 9), 1, 0,
            (2, 6), 2, 0),
    CaptureGraph((
        Axpy(4, 2.0, buf(F32, 4), buf(F32, 4, 2)),
        CopyBuffer(buf(F32, 4, 2), buf(F32, 4, 3), 4),
        LaunchKernel(_KERNEL, (1, 1, 1), (32, 1, 1), (buf(F32, 4, 3), np.int32(4))),
    )),
    LaunchGraph(_GRAPH),
    DestroyGraph(_GRAPH),
    OpSequence((
        Axpy(4, 2.0, buf(F32, 4), buf(F32, 4, 2)),
        Dot(4, buf(F32, 4), buf(F32, 4, 2)),
        CopyBuffer(buf(F32, 4, 2), buf(F32, 4, 3), 4),
    )),
    CompileKernel('extern "C" __global__ void k() {}', "k", options=("-lineinfo",),
                  defines=(("N", "4"),), fast_math=True, arch="sm_90"),
    LoadKernel(b"\x7fELF\x02\x01", "k"),
    LaunchKernel(_KERNEL, (4, 1, 1), (128, 1, 1),
                 (buf(F32, 8, owner=99), np.int32(4), np.float32(0.5)), 256, (0,)),
    Allocate(C128, 10, managed=True, attach=Attach.HOST),
    Prefetch(buf(F32, 8), Location.HOST),
    Advise(buf(F32, 8), Advice.READ_MOSTLY),
    Free(buf(F32, 8)),
    Upload(buf(F32, 8), np.arange(8, dtype=np.float32), 0),
    Download(buf(F32, 8), 2, None),
    CopyBuffer(buf(F32, 8), buf(F32, 8, 2), 4, 1, 2),
    MemoryInfo(),
    LibraryAvailable("cudnn"),
    CanAccessPeer((0, 1)),
    EnablePeerAccess((1,)),
    ExportBuffer(buf(F32, 8), ipc=True),
    BufferAddress(buf(F32, 8)),
    IpcGetHandle(buf(F32, 8)),
    IpcOpenHandle(b"\x02" * 64, F64, 8),
    ImportCopy(PeerSource(1234, 1, F32, 8, 0xDEADBEEF, b"\x01" * 64, 256), buf(F32, 8), 8),
    RngFill(buf(F32, 8), Distribution.NORMAL, 42, 8, (0.0, 2.0), None),
    CsrSpMV(_csr(), buf(F32, 4, 2), buf(F32, 3, 3), alpha=2.0, beta=0.5),
    CsrSpMM(_csr(7), buf(F32, 12, 2), buf(F32, 15, 3), 3, ldc=5),
    Contract(buf(F32, 6), "ab", (2, 3), buf(F32, 12, 2), "bc", (3, 4), buf(F32, 8, 3), "ac",
             (2, 4), alpha=1.5),
    TopK(buf(F32, 12), 3, 4, 2, keys=buf(DType.I64, 4, 2)),
    ScoreTopK(np.ones((2, 3), np.float32), buf(F32, 12), 4, 3, 2, keys=buf(DType.I64, 4, 2),
              bias=buf(F32, 4, 3), alpha=2.0),
    CommInit(3, 1, 2, 1, b"\x05" * 128, "/dev/shm/atomr-nccl-word"),
    CommAbort(3),
    RunCollective(3, 1, 2, (CollectiveCall(CallKind.ALL_REDUCE, buf(F32, 8), buf(F32, 8, 2),
                                           8, ReduceOp.AVG),
                            CollectiveCall(CallKind.SEND, buf(F32, 8), None, 8, root=1)), 5.0),
    FusedMatmul(buf(F32, 6), buf(F32, 12, 2), buf(F32, 8, 3), 2, 4, 3, Epilogue.BIAS_GELU,
                bias=buf(F32, 4, 4), aux=buf(F32, 16, 5), beta=0.5),
    FusedMatmulGrad(buf(F32, 6), buf(F32, 12, 2), buf(F32, 8, 3), 2, 4, 3,
                    Epilogue.DRELU_BGRAD, aux=buf(DType.U8, 32, 5), bias_grad=buf(F32, 4, 4)),
    Conv2dForward(buf(F32, 150), buf(F32, 108, 2), buf(F32, 72, 3), (2, 3, 5, 5),
                  (4, 3, 3, 3), (2, 4, 3, 3), layout=Layout.NHWC, autotune=True),
    Conv2dBackwardData(buf(BF16, 80), buf(BF16, 72, 2), buf(BF16, 200, 3), (2, 4, 2, 5),
                       (4, 2, 3, 3), (2, 4, 5, 5), (0, 1), (2, 1), groups=2),
    Conv2dBackwardFilter(buf(F64, 150), buf(F64, 72, 2), buf(F64, 108, 3), (2, 3, 5, 5),
                         (2, 4, 3, 3), (4, 3, 3, 3), alpha=0.5, beta=1.0),
    Pool2dForward(buf(F32, 96), buf(F32, 24, 2), (2, 3, 4, 4), (2, 3, 2, 2)),
    Pool2dBackward(buf(F16, 96), buf(F16, 24, 2), buf(F16, 24, 3), buf(F16, 96, 4),
                   (2, 3, 4, 4), (2, 3, 2, 2), (3, 3), (1, 1), (0, 0),
                   PoolMode.AVG_EXCLUDE_PADDING),
    SoftmaxForward(buf(F32, 40), buf(F32, 40, 2), (4, 10), SoftmaxMode.INSTANCE, log=True),
    SoftmaxBackward(buf(F32, 40), buf(F32, 40, 2), buf(F32, 40, 3), (4, 10)),
    ActivationForward(buf(F32, 12), buf(F32, 12), (3, 4), Activation.ELU, coef=0.5),
    ActivationBackward(buf(F32, 12), buf(F32, 12, 2), buf(F32, 12, 3), (12,),
                       Activation.GELU),
    DropoutForward(buf(F32, 8), buf(F32, 8, 2), buf(U8, 8, 3), (2, 4), 0.25, 42),
    DropoutBackward(buf(F32, 8), buf(U8, 8, 2), buf(F32, 8, 3), (8,), 0.25),
    LrnForward(buf(F32, 24), buf(F32, 24, 2), (1, 6, 2, 2), n=3, layout=Layout.NHWC),
    SdpaForward(buf(BF16, 64), buf(BF16, 128, 2), buf(BF16, 128, 3), buf(BF16, 64, 4), 1, 2,
                1, 4, 16, 8, stats=buf(F32, 8, 5), causal=True, window=4, sink_tokens=1,
                block_table=buf(I32, 2, 6), context_lens=buf(I32, 1, 7), block_size=8),
    SdpaBackward(*(buf(F16, 64, i) for i in range(1, 6)), buf(F32, 8, 9),
                 *(buf(F16, 64, i) for i in range(6, 9)), 1, 2, 2, 4, 4, 8, causal=True),
    SdpaSupport("sm_90", 128, 4, AttnMask.CAUSAL_SLIDING_WINDOW, 256, False, 4),
    MultiHeadAttnForward(*(buf(F32, 64, i) for i in range(1, 5)), 1, 4, 4, 2, 2, 8,
                         mask=AttnMask.CAUSAL, dropout=0.1, dropout_seed=3),
    MultiHeadAttnBackward(*(buf(F32, 64, i) for i in range(1, 9)), 1, 4, 4, 2, 1, 8,
                          mask=AttnMask.SLIDING_WINDOW, window=2),
    BatchNorm(buf(F32, 24), buf(F32, 24, 2), buf(F32, 3, 3), buf(F32, 3, 4), (2, 3, 4),
              buf(F32, 3, 5), buf(F32, 3, 6), phase=NormPhase.INFERENCE),
    LayerNorm(buf(DType.BF16, 24), buf(DType.BF16, 24, 2), buf(F32, 12, 3), buf(F32, 12, 4),
              (2, 3, 4), 2, buf(F32, 2, 5), buf(F32, 2, 6), 1e-3),
    InstanceNorm(buf(F64, 24), buf(F64, 24, 2), buf(F64, 3, 3), buf(F64, 3, 4), (2, 3, 4)),
    GroupNorm(buf(F32, 32), buf(F32, 32, 2), buf(F32, 4, 3), buf(F32, 4, 4), (2, 4, 4), 2,
              buf(F32, 4, 5)),
    RmsNorm(buf(DType.F16, 24), buf(DType.F16, 24, 2), buf(F32, 4, 3), (6, 4), 1,
            buf(F32, 6, 4)),
    NormBwd(buf(F32, 24), buf(F32, 24, 2), buf(F32, 4, 3), None, buf(F32, 6, 4),
            buf(F32, 24, 5), buf(F32, 4, 6), None, (6, 4), NormMode.RMS),
    RnnFwd(buf(F32, 12), None, buf(F32, 2 * (4 * 2 * 5 + 16), 2), buf(F32, 24, 3),
           buf(F32, 8, 4), None, buf(F32, 8, 5), RnnMode.LSTM, RnnDirection.BI, 1, 3, 2, 2,
           2),
    RnnBwd(buf(F64, 12), buf(F64, 42, 2), buf(F64, 8, 3), buf(F64, 12, 4),
           buf(F64, 42, 5), dh_in=buf(F64, 4, 6), mode=RnnMode.GRU, input_size=3,
           hidden_size=2, seq_length=2, batch_size=2),
    ParticleStep(buf(F32, 12), buf(F32, 12, 2), buf(F32, 4, 3), buf(I32, 1, 4), 4, 0.01,
                 drag=0.5),
    ParticleCompact(buf(F32, 12), buf(F32, 12, 2), buf(F32, 4, 3), 4),
    ClothStep(buf(F32, 36), buf(F32, 36, 2), buf(F32, 12, 3), 4, 3, 0.1, 0.5, 4, 0.02,
              wind=(1.0, 0.0, 0.5)),
    FluidAddSource(buf(F32, 12), buf(F32, 15, 2), buf(F32, 16, 3), 4, 3, 1, 2, 1.0, 0.5),
    FluidStep(buf(F32, 15), buf(F32, 16, 2), buf(F32, 12, 3), buf(F32, 12, 4),
              buf(F32, 12, 5), buf(F32, fluid_scratch(4, 3), 6), 4, 3, 0.05, viscosity=0.1),
    FluidDivergence(buf(F32, 15), buf(F32, 16, 2), buf(F32, 12, 3), 4, 3),
    GridBuild(buf(F32, 30), buf(I32, 10, 2), buf(I32, 16, 3), buf(I32, 16, 4), 10, 16, 0.5),
    GridQuery(buf(F32, 30), buf(I32, 10, 2), buf(I32, 16, 3), buf(I32, 16, 4),
              buf(F32, 6, 5), 10, 16, 0.5, 2, 0.75),
    HashInsert(_TABLE, buf(U8, 9, 24), buf(U8, 6, 25), 3, 5),
    HashLookup(_TABLE, buf(U8, 9, 24), 3, buf(U8, 6, 25), buf(U8, 3, 26)),
    HashErase(_TABLE, buf(U8, 9, 24), 3),
    BuildCsr(buf(I32, 6, 31), buf(I32, 6, 32), buf(F32, 6, 33), 6, 3, 4, buf(I32, 4, 34),
             buf(I32, 11, 35), buf(F32, 11, 36), _csr()),
    FilterFrames(buf(U8, 24), buf(F32, 24, 2), 2, 4, 3, _STAGES),
    FrameStats(buf(F32, 24), 2, 4, 3, 16, -1.0, 1.0),
    BlendFrames(buf(U8, 24), buf(F32, 24, 2), buf(U8, 24), 24, 0.25, 0.75),
    LoadOnnxModel(b"\x08\x08:model", ("CPUExecutionProvider",), threads=2, spinning=True),
    RunOnnxModel("ab" * 32, (("x", np.ones((2, 3), np.float32)),
                             ("m", DeviceTensor(buf(F32, 8, 2), (2, 4)))),
                 ("y",), (("z", DeviceTensor(buf(F32, 6, 3), (2, 3))),)),
    UnloadOnnxModel("ab" * 32),
    LinearForward(buf(F32, 12, 51), buf(F32, 20, 52), buf(F32, 15, 53), 3, 4, 5, 0, 20 - 5),
    LinearBackward(buf(F32, 12, 51), buf(F32, 20, 52), buf(F32, 15, 53), buf(F32, 20, 54),
                   buf(F32, 12, 55), 3, 4, 5, 0, None),
    LayerNormForward(buf(F64, 12, 51), buf(F64, 8, 52), buf(F64, 12, 53), buf(F64, 3, 54),
                     buf(F64, 3, 55), 3, 4, 0, 4, 1e-5),
    LayerNormBackward(buf(F32, 12, 51), buf(F32, 8, 52), buf(F32, 12, 53), buf(F32, 3, 54),
                      buf(F32, 3, 55), buf(F32, 8, 56), None, 3, 4, 0, 4),
    SoftmaxCrossEntropy(buf(F32, 12, 51), buf(I32, 3, 52), buf(F32, 1, 53),
                        buf(F32, 12, 54), 3, 4, label_smoothing=0.1, grad_scale=0.5),
    MseLoss(buf(F32, 12, 51), buf(F32, 12, 52), buf(F32, 1, 53), None, 12),
    SgdUpdate(buf(F32, 20, 51), buf(F32, 20, 52), buf(F32, 20, 53), 5, 15, 0.1,
              momentum=0.9, nesterov=True, weight_decay=1e-4, first_step=True),
    AdamUpdate(buf(F32, 20, 51), buf(F32, 20, 52), buf(F32, 20, 53), buf(F32, 20, 54), 0,
               20, 1e-3, 3, decoupled=True, weight_decay=0.01),
    FillZeros(buf(F32, 20, 51), 4),
    GradCheck((buf(F32, 20, 51), buf(F32, 8, 52)), buf(F32, 3, 53)),
    CutlassGemm(buf(BF16, 48, 51), buf(BF16, 64, 52), buf(BF16, 24, 53), 3, 8, 8,
                CutlassEpilogue().scale(0.5).bias(buf(BF16, 3, 54), "row")
                .residual_add(buf(BF16, 24, 55), 2.0).gelu().reduce(buf(F32, 8, 56), "column")),
    CutlassGroupedGemm(buf(F16, 9, 51), buf(F16, 20, 52), buf(F16, 13, 53),
                       ((1, 1, 1), (0, 4, 2), (3, 4, 2)), alpha=0.5),
    CutlassConv2d(buf(F32, 2 * 5 * 5 * 4, 51), buf(F32, 8 * 3 * 3 * 4, 52),
                  buf(F32, 2 * 3 * 5 * 8, 53), 2, 5, 5, 4, 8, 3, 3, pad=(0, 1), stride=(1, 1),
                  dilation=(1, 1), alpha=2.0, bias=buf(F32, 8, 54)),
    CutlassStats(),
    CutlassGemmFp8(buf(U8, 32 * 16, 51), buf(U8, 16 * 16, 52),
                   buf(BF16, 32 * 16, 53), 32, 16, 16,
                   CutlassEpilogue().bias(buf(BF16, 16, 54)).relu(), "e4m3", "e5m2", 0.5, 2.0),
    CallFunction(UserCode(len, "len", 7), Packed((BufferArg(0), 2, "x"), {"k": 1.5}),
                 (buf(F32, 8, 61),), "numpy", keep=True, pure=True),
    BuildResident(8, UserCode(dict, "table", 8), Packed((), {"size": 3})),
    FreeResident(8),
    ViewBuffer(buf(F64, 4, 62)),
    AdoptArray(np.arange(4.0)),
    ExternalWrite((buf(F32, 8, 63), buf(F32, 3, 64)), _RecordedEvent()),
    *collected(),  # the libraries that keep their examples in op_examples/
]


def _op_classes() -> set[type]:
    """Every op dataclass defined in ``atomr_accel.core.ops``."""
    found = set()
    for info in pkgutil.iter_modules(atomr_accel.core.ops.__path__):
        module = importlib.import_module(f"atomr_accel.core.ops.{info.name}")
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, Op) and dataclasses.is_dataclass(obj)
                    and obj.__module__ == module.__name__):
                found.add(obj)
    return found


def test_examples_cover_every_op_class() -> None:
    assert {type(op) for op in EXAMPLES} == _op_classes()
    assert len(EXAMPLES) == len(_op_classes())


@pytest.mark.parametrize("op", EXAMPLES, ids=lambda op: type(op).__name__)
def test_examples_are_valid_ops(op: Op) -> None:
    op.validate()


# --------------------------------- Matrix, Vector and LinalgOp against the plain checks


def _reference_of(
    name: str, ref: GpuRef, rows: int, cols: int, ld: int | None, *, trans: bool = False,
    batch: int = 1, stride: int | None = None,
) -> tuple[object, ...]:
    """``Matrix.of`` written plainly."""
    stored_rows, stored_cols = (cols, rows) if trans else (rows, cols)
    resolved_ld = max(1, stored_rows) if ld is None else ld
    resolved_stride = resolved_ld * stored_cols if stride is None else stride
    return (name, ref, stored_rows, stored_cols, resolved_ld, batch, resolved_stride)


def _reference_check(operand: Matrix | Vector, written: bool) -> None:
    """``Matrix.check`` and ``Vector.check`` written plainly, every name built up front."""
    if isinstance(operand, Matrix):
        name = operand.name
        require_nonneg(**{
            f"rows of {name}": operand.rows,
            f"cols of {name}": operand.cols,
            f"batch of {name}": operand.batch,
            f"stride of {name}": operand.stride,
        })
        require_positive(**{f"leading dimension of {name}": operand.ld})
        one = matrix_extent(operand.rows, operand.cols, operand.ld, name)
        if written and operand.batch > 1:
            require(operand.stride >= one, f"stride of {name} is {operand.stride}; the written "
                    f"matrices overlap unless it is >= {one}")
        extent = 0 if operand.batch == 0 or one == 0 else (operand.batch - 1) * operand.stride + one
        require_len(operand.ref, extent, name)
    else:
        require_nonneg(**{f"length of {operand.name}": operand.n})
        inc = operand.inc
        require(isinstance(inc, int) and not isinstance(inc, bool) and inc != 0,
                f"increment of {operand.name} must be a non-zero int, got {inc!r}")
        require_len(operand.ref, 0 if operand.n == 0 else 1 + (operand.n - 1) * abs(inc),
                    operand.name)


def _reference_validate(op: LinalgOp) -> None:
    """``LinalgOp.validate`` written plainly."""
    require_nonneg(**op.sizes())
    operands = op.operands()
    require_dtype(operands[0].ref, FLOAT_DTYPES, operands[0].name)
    dtype = require_same_dtype(**{o.name: o.ref for o in operands})
    for operand in operands:
        _reference_check(operand, operand.name in op.outputs)
    for name, value in op.scalars().items():
        require_scalar(name, value, dtype)
    op.check_extra(dtype)


LINALG = [op for op in EXAMPLES if isinstance(op, LinalgOp)]

_NUDGES: dict[str, tuple[object, ...]] = {
    "size": (0, 1, 5, -1, _Int(2), 2.0, True),
    "scalar": (2, -1.5, 1j, True, "2", Fraction(1, 2), np.float32(2)),
}


def _variants(op: Any) -> list[Any]:
    """The op with each size, scalar and buffer nudged: valid and invalid neighbours."""
    out = [op]
    for field in dataclasses.fields(op):
        value = getattr(op, field.name)
        if type(value) is int or (value is None and field.name.startswith(("ld", "stride"))):
            news: tuple[object, ...] = _NUDGES["size"]
        elif field.name in ("alpha", "beta"):
            news = _NUDGES["scalar"]
        elif isinstance(value, GpuRef):
            news = (dataclasses.replace(value, dtype=F64 if value.dtype is F32 else F32),
                    dataclasses.replace(value, dtype=I32), dataclasses.replace(value, length=1))
        else:
            continue
        out.extend(dataclasses.replace(op, **{field.name: new}) for new in news)
    return out


@pytest.mark.parametrize("op", [v for op in LINALG for v in _variants(op)], ids=repr)
def test_linalg_checks_match_the_plain_reference(op: LinalgOp) -> None:
    assert _outcome(op.validate) == _outcome(lambda: _reference_validate(op))
    if not _outcome(op.operands).startswith("ok"):
        return
    for operand in op.operands():
        assert type(operand) in (Matrix, Vector)
        for written in (False, True):
            assert _outcome(lambda o=operand, w=written: o.check(w)) == _outcome(
                lambda o=operand, w=written: _reference_check(o, w)
            )


@pytest.mark.parametrize(
    ("rows", "cols", "ld", "trans", "batch", "stride"),
    list(itertools.product((0, 1, 3), (0, 2), (None, 5), (False, True), (1, 3), (None, 0, 7))),
)
def test_matrix_of_resolves_like_the_plain_reference(
    rows: int, cols: int, ld: int | None, trans: bool, batch: int, stride: int | None
) -> None:
    ref = buf(F32, 64)
    made = Matrix.of("a", ref, rows, cols, ld, trans=trans, batch=batch, stride=stride)
    assert type(made) is Matrix
    assert made == Matrix(*_reference_of("a", ref, rows, cols, ld, trans=trans, batch=batch,
                                         stride=stride))


def test_operands_are_immutable_hashable_picklable_tuples() -> None:
    assert Matrix._fields == ("name", "ref", "rows", "cols", "ld", "batch", "stride")
    assert Matrix._field_defaults == {"batch": 1, "stride": 0}
    assert Vector._fields == ("name", "ref", "n", "inc")
    assert Vector._field_defaults == {"inc": 1}
    a, _, c = Gemm(buf(F32, 64), buf(F32, 64, 2), buf(F32, 64, 3), 8, 4, 2).operands()
    assert a == Matrix("a", buf(F32, 64), 8, 2, 8, 1, 16)
    assert (a.single_extent, a.extent, c.extent) == (16, 16, 32)
    same = Matrix(a.name, a.ref, a.rows, a.cols, a.ld, a.batch, a.stride)
    assert hash(a) == hash(same) and repr(a) == repr(same)
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(AttributeError):
        a.rows = 1  # type: ignore[misc]
    x = Vector("x", buf(F32, 7), 4, -2)
    assert x.extent == 7 and pickle.loads(pickle.dumps(x)) == x
    with pytest.raises(AttributeError):
        x.n = 1  # type: ignore[misc]


@pytest.mark.parametrize("op", LINALG, ids=repr)
def test_linalg_ops_stay_slotted_frozen(op: Any) -> None:
    assert not hasattr(op, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(op, dataclasses.fields(op)[0].name, None)


BAD: list[tuple[Callable[[], Op], str]] = [
    (lambda: Gemm(buf(F32, 4), buf(F32, 4), buf(F32, 4), -1, 2, 2),
     "m must be a non-negative int, got -1"),
    (lambda: Gemm(buf(F32, 9), buf(F32, 9), buf(F32, 9), 3, 3, 3, lda=2),
     "leading dimension of a is 2; it must be >= 3"),
    (lambda: Gemm(buf(F32, 9), buf(F32, 9), buf(F32, 9), 3, 3, 3, lda=0),
     "leading dimension of a must be a positive int, got 0"),
    (lambda: Gemm(buf(F32, 9), buf(F32, 9), buf(F32, 9), 3, 3, 3, ldb=1.5),  # type: ignore[arg-type]
     "stride of b must be a non-negative int, got 4.5"),
    (lambda: Gemm(buf(F32, 4), buf(F64, 4), buf(F32, 4), 2, 2, 2),
     "b has dtype f64 but a has f32"),
    (lambda: Gemm(buf(F32, 4), buf(F32, 4), buf(F32, 4), 2, 2, 2, alpha=1j),
     "alpha must be a real number for f32 operands, got 1j"),
    (lambda: Gemm(buf(C64, 4), buf(C64, 4), buf(C64, 4), 2, 2, 2, conj_a=True),
     "a asks for a conjugate without a transpose"),
    (lambda: GemmStridedBatched(buf(F32, 8), buf(F32, 8), buf(F32, 8), 2, 2, 2, 2,
                                stride_c=3),
     "stride of c is 3; the written matrices overlap unless it is >= 4"),
    (lambda: Axpy(4, 1.0, buf(F32, 4), buf(F32, 9), incy=-3),
     "y needs 10 elements but its buffer holds 9"),
    (lambda: Axpy(4, 1.0, buf(F32, 4), buf(F32, 9), incx=0),
     "increment of x must be a non-zero int, got 0"),
    (lambda: Nrm2(3, buf(F32, 9), incx=-1), "incx must be a positive int, got -1"),
    (lambda: Orgqr(buf(F32, 12), buf(F32, 3), 3, 4, 2),
     "orgqr needs m >= n >= k, got m=3, n=4, k=2"),
    (lambda: Fft(buf(C64, 8), buf(C64, 8, 2), (4, 0), FftKind.C2C),
     "shape[1] must be a positive int, got 0"),
    (lambda: RngFill(buf(F32, 8), Distribution.UNIFORM, 1, 0, (1.0, 0.0)),
     "high (0.0) must exceed low (1.0)"),
    (lambda: RngFill(buf(I32, 8), Distribution.NORMAL, 1),
     "out of a NORMAL fill has dtype i32; expected one of f32, f64"),
    (lambda: RngFill(buf(F32, 8), Distribution.NORMAL, 1, 0, (0.0, Fraction(1, 2))),  # type: ignore[arg-type]
     "stddev must be a finite real number, got Fraction(1, 2)"),
    (lambda: Upload(buf(F32, 8), np.ones(4, np.float64)),
     "upload data has dtype float64 but the buffer holds f32"),
    (lambda: CopyBuffer(buf(F32, 8), buf(F32, 4, 2), 8),
     "dst needs 8 elements but its buffer holds 4"),
]


@pytest.mark.parametrize(("make", "message"), BAD, ids=[m for _, m in BAD])
def test_refusals_keep_their_messages(make: Callable[[], Op], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        make().validate()
    assert str(caught.value) == message


@dataclasses.dataclass(frozen=True, slots=True)
class _OneRef(Op):
    ref: GpuRef


@dataclasses.dataclass(frozen=True, slots=True)
class _TwoRefs(_OneRef):
    other: GpuRef
    count: int = 0


def test_refs_are_the_fields_each_class_declares_as_buffers() -> None:
    a, b = buf(F32, 4), buf(F32, 4, 2)
    assert _OneRef(a).refs() == (a,)
    assert _TwoRefs(a, b).refs() == (a, b)
    assert _TwoRefs(a, b, 3).refs() == (a, b)
    assert MemoryInfo().refs() == ()
    gemm = Gemm(a, b, a, 1, 1, 1, trans_a=b)  # type: ignore[arg-type]
    assert gemm.refs() == (a, b, a)  # the fields declared as buffers, nothing else
    assert gemm.writes() == (a,)


# ------------------------------------------------------------------- pickling


def _assert_same(got: object, want: object) -> None:
    """``got`` equals ``want`` with the same types all the way down (arrays by NumPy)."""
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want)
    elif dataclasses.is_dataclass(want):
        for field in dataclasses.fields(want):  # compare=False fields too (cache_hit)
            _assert_same(getattr(got, field.name), getattr(want, field.name))
    elif isinstance(want, tuple | list):
        assert isinstance(got, tuple | list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    else:
        assert got == want


def _holds_array(value: object) -> bool:
    if isinstance(value, np.ndarray):
        return True
    if dataclasses.is_dataclass(value):
        return any(_holds_array(getattr(value, f.name)) for f in dataclasses.fields(value))
    return isinstance(value, tuple) and any(_holds_array(v) for v in value)


_VALUES: list[Any] = [
    _TABLE,
    *_STAGES,
    buf(F32, 8, 3, owner=12345),
    _KERNEL,
    _GRAPH,
    _csr(),
    PeerSource(1, 0, C64, 4, 64, None, 0),
    DeviceTensor(buf(F32, 8), (2, 4)),
    OnnxModelInfo("ab" * 32, (OnnxTensorInfo("x", "float32", (None, 4)),),
                  (OnnxTensorInfo("y", "float32", (None, 2)),), ("CPUExecutionProvider",)),
    *DType,
    *FftKind, *Distribution, *FaultKind, *Location, *Advice,
    *NormMode, *NormPhase, *RnnMode, *RnnDirection,
]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("value", EXAMPLES + _VALUES, ids=repr)
def test_round_trips_give_equal_objects(value: Any, protocol: int) -> None:
    got = pickle.loads(pickle.dumps((value, 1, None), protocol=protocol))
    _assert_same(got, (value, 1, None))
    if isinstance(value, enum.Enum):
        assert got[0] is value
    if not _holds_array(value):
        assert got[0] == value and hash(got[0]) == hash(value)


@pytest.mark.parametrize("value", EXAMPLES + _VALUES, ids=repr)
def test_copies_give_equal_objects(value: Any) -> None:
    _assert_same(copy.copy(value), value)
    _assert_same(copy.deepcopy(value), value)


def test_unpickling_skips_validate() -> None:
    bad = Gemm(buf(F32, 4), buf(F64, 4), buf(F32, 4), -1, 2, 2, lda=0)
    with pytest.raises(InvalidArgument):
        bad.validate()
    _assert_same(pickle.loads(pickle.dumps(bad, protocol=5)), bad)
    payload = pickle.dumps(EXAMPLES + _VALUES, protocol=5)
    calls: list[type] = []

    def spy(self: object, *args: object, **kwargs: object) -> None:
        calls.append(type(self))

    with pytest.MonkeyPatch.context() as patch:
        for cls in _op_classes():
            patch.setattr(cls, "validate", spy)
        _assert_same(pickle.loads(payload), EXAMPLES + _VALUES)
    assert calls == []


def test_a_subclass_unpickles_as_itself() -> None:
    a, b = buf(F32, 4), buf(F32, 4, 2)
    for value in (_OneRef(a), _TwoRefs(a, b, 3), _OneRef(b)):
        _assert_same(pickle.loads(pickle.dumps(value, protocol=5)), value)


def test_pickles_name_their_class_and_the_dtype_by_name() -> None:
    payload = pickle.dumps(EXAMPLES[0], protocol=5)
    assert b"Gemm" in payload and b"GpuRef" in payload and b"DType.F32" in payload
    assert b"copyreg" not in payload


class _EarlierFormat(pickle.Pickler):
    """Pickle core values as they pickled before they had their own ``__reduce_ex__``."""

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, enum.Enum):
            return type(obj), (obj.value,)
        if isinstance(obj, PickleByFields | GpuRef):
            return object.__reduce_ex__(obj, 5)  # copyreg.__newobj__ and the dataclass state
        return NotImplemented


def test_pickles_of_the_earlier_format_still_load() -> None:
    buffer = io.BytesIO()
    _EarlierFormat(buffer, protocol=5).dump(EXAMPLES + _VALUES)
    opcodes = {opcode.name for opcode, _, _ in pickletools.genops(buffer.getvalue())}
    assert {"NEWOBJ", "BUILD"} <= opcodes  # as copyreg.__newobj__ and __setstate__ left them
    _assert_same(pickle.loads(buffer.getvalue()), EXAMPLES + _VALUES)
