"""Kernel plans of the ``cutlass`` library: which CUTLASS kernel runs a problem.

A plan is pure data decided on the host from the problem class (the op kind,
the dtype, the problem's size class, the bias broadcast) and the target
architecture: the CTA tile, the thread-block cluster, the kernel schedule and
the pipeline stage count. The CUDA backend instantiates exactly that kernel
from the plan (``backends.cuda._cutlass_source``) and caches it on disk under
``key``, which also names the CUTLASS version the kernel was generated with.

Two template families:

- ``sm90``: CUTLASS 3.x's Hopper kernels (TMA loads, WGMMA, warp-specialized
  ``cooperative`` schedule, a persistent tile scheduler) for ``sm_90`` /
  ``sm_90a``: GEMMs whose rows are 16-byte aligned, grouped and fp8 GEMMs.
- ``sm80``: CUTLASS 2.x's Ampere kernels (``cp.async`` ``multistage``
  mainloop, or the two-stage ``pipelined`` one for 2-byte loads, and
  ``mma.sync`` tensor-core instructions, f64 on DMMA 8x8x4), which every
  architecture from ``sm_80`` on runs: GEMMs on Ampere, Ada and Blackwell,
  f64 GEMMs, GEMMs whose ``k`` or ``n`` is not a multiple of the 16-byte
  vector (narrower loads: ``align`` elements), and convolutions.

A plan's ``arch`` is the architecture its kernel is compiled for; its
``family`` the templates it instantiates (an ``sm80`` kernel compiled for
``sm_90a`` runs on an H100).
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._fields import pickle_by_name

__all__ = [
    "ARCHS",
    "CUTLASS_VERSION",
    "FAMILIES",
    "KNOWN_ARCHS",
    "SMEM_BYTES",
    "KernelPlan",
    "native_family",
    "smem_limit",
    "vector_alignment",
    "PlanKind",
    "FP8_FORMATS",
    "FP8_OUT_DTYPES",
    "conv2d_plan",
    "gemm_fp8_plan",
    "gemm_plan",
    "grouped_plan",
]

CUTLASS_VERSION = "4.2.0"
"""The CUTLASS release (``nvidia-cutlass``) the kernels are generated from."""
KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120")
"""The architectures the original package's plans named."""
ARCHS = KNOWN_ARCHS
"""The architectures this package plans and builds CUTLASS kernels for (``sm_90`` is
compiled as ``sm_90a``)."""
FAMILIES = ("sm80", "sm90")
"""The template families: CUTLASS 2.x Ampere kernels, CUTLASS 3.x Hopper kernels."""
SMEM_BYTES = 232448
"""Shared memory a Hopper CTA may use (227 KiB)."""
_SMEM = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90": SMEM_BYTES,
         "sm_90a": SMEM_BYTES, "sm_100": SMEM_BYTES, "sm_120": 101376}
"""Shared memory one CTA may use, by architecture (163 KiB on A100, 99 KiB on the
GA10x / Ada / consumer-Blackwell parts, 227 KiB on H100 and B200)."""
_EPILOGUE_RESERVE = {2: 34816, 4: 69632}
"""Shared memory kept for the epilogue (C/D staging, bias) when counting mainloop stages, by
element size (measured: 33664 bytes for a 16-bit 128x256 tile, 34688 for the 16-bit grouped
kernel, 67392 for an f32 128x128 tile)."""
_STAGE_BARRIER = 32
"""Bytes of pipeline barriers per mainloop stage."""
_MAX_STAGES = 8
_LARGE = 2048 * 2048
"""Output elements from which a GEMM takes the 128x256 tile and a 2x1 cluster."""


class PlanKind(enum.Enum):
    """What a plan's kernel computes."""

    GEMM = "gemm"
    GEMM_FP8 = "gemm_fp8"
    GROUPED = "grouped"
    CONV2D = "conv2d"

    __reduce_ex__ = pickle_by_name


@dataclass(frozen=True, slots=True)
class KernelPlan:
    """One CUTLASS kernel: ``kind``, element ``dtype`` (f32 runs as TF32 on tensor cores),
    ``arch`` (what it is compiled for), CTA ``tile`` (M, N, K), ``cluster`` shape,
    ``schedule``, mainloop ``stages``, ``warp`` tile (convolutions and ``sm80`` GEMMs),
    ``bias_axis`` (GEMMs: the fused bias broadcast,
    ``"row"`` or ``"column"``) and ``formats`` (fp8 GEMMs: A's and B's fp8 formats).
    ``family`` and ``align`` (below). ``key`` names it in the kernel cache; ``int(plan)``
    is the key (the original package's plans were ints)."""

    kind: PlanKind
    dtype: DType
    arch: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    schedule: str
    stages: int
    warp: tuple[int, int, int] = (0, 0, 0)
    bias_axis: str = "column"
    formats: tuple[str, str] = ("", "")
    """fp8 GEMMs: the formats of ``A`` and ``B`` (``e4m3`` / ``e5m2``); ``dtype`` is D's."""
    family: str = "sm90"
    """The template family: ``sm90`` (CUTLASS 3.x Hopper) or ``sm80`` (CUTLASS 2.x Ampere)."""
    align: int = 0
    """GEMMs: elements per global load of ``A``, ``B``, ``C`` and ``D`` (a 16-byte vector, or
    fewer for sizes that are not multiples of one); 0 for the other kinds."""

    @property
    def name(self) -> str:
        """A readable name: kind, dtype, tile, cluster, schedule, stages, bias axis, load
        width, family, arch."""
        t = "x".join(map(str, self.tile))
        c = "x".join(map(str, self.cluster))
        extra = f"_bias{self.bias_axis}" if self.kind is PlanKind.GEMM else ""
        if self.kind is PlanKind.GEMM_FP8:
            extra = f"_{self.formats[0]}x{self.formats[1]}_bias{self.bias_axis}"
        if self.align:
            extra += f"_a{self.align}"
        return (f"{self.kind.value}_{self.dtype.value}_{t}_c{c}_{self.schedule}"
                f"_s{self.stages}{extra}_{self.family}_{self.arch}")

    @property
    def key(self) -> int:
        """A stable 63-bit key of the plan and the CUTLASS version."""
        text = f"{self.name}/{self.warp}/cutlass-{CUTLASS_VERSION}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1

    def __int__(self) -> int:
        return self.key

    def __index__(self) -> int:
        return self.key


def _arch(arch: str) -> str:
    if not isinstance(arch, str) or arch not in KNOWN_ARCHS:
        raise InvalidArgument(f"arch must be one of {', '.join(KNOWN_ARCHS)}, got {arch!r}")
    return arch


def native_family(arch: str) -> str:
    """The family ``arch``'s GEMMs use by default: ``sm90`` on ``sm_90`` / ``sm_90a``, else
    ``sm80`` (Blackwell has no WGMMA: the Hopper templates do not run there)."""
    return "sm90" if _arch(arch) in ("sm_90", "sm_90a") else "sm80"


def smem_limit(arch: str) -> int:
    """Shared memory one CTA may use on ``arch``."""
    return _SMEM[_arch(arch)]


def _hopper(arch: str, what: str) -> str:
    if native_family(arch) != "sm90":
        raise InvalidArgument(f"{what} runs CUTLASS's Hopper (SM90) templates: arch must be "
                              f"sm_90 or sm_90a, got {arch}")
    return arch


def vector_alignment(dtype: DType, *dims: int) -> int:
    """The widest load (elements, at most 16 bytes) that every row of ``dims`` elements
    starts on: the largest power of two up to ``16 / itemsize`` dividing them all."""
    align = 16 // dtype.itemsize
    while align > 1 and any(d % align for d in dims):
        align //= 2
    return align


def _dtype(dtype: DType, allowed: tuple[DType, ...], what: str) -> DType:
    if dtype not in allowed:
        names = ", ".join(d.value for d in allowed)
        raise InvalidArgument(f"{what} takes {names} data, got {getattr(dtype, 'value', dtype)}")
    return dtype


def _stages(tile: tuple[int, int, int], itemsize: int) -> int:
    per_stage = (tile[0] + tile[1]) * tile[2] * itemsize + _STAGE_BARRIER
    return min(_MAX_STAGES, (SMEM_BYTES - _EPILOGUE_RESERVE[itemsize]) // per_stage)


GEMM_DTYPES = (DType.F16, DType.BF16, DType.F32, DType.F64)
_SM80_MAX_STAGES = 4
_Tiles = dict[str, tuple[tuple[int, int, int], tuple[int, int, int]]]
_SM80_TILES: _Tiles = {
    "f64": ((128, 128, 16), (32, 64, 16)),
    "f32": ((128, 128, 32), (64, 64, 32)),
    "large": ((128, 256, 32), (64, 64, 32)),
    "small": ((128, 128, 32), (64, 64, 32)),
}
"""The sm80 family's GEMM tile and warp tile, by ``_tile_row``."""
_SM90_TILES: _Tiles = {
    "f32": ((128, 128, 32), (1, 1, 1)),
    "large": ((128, 256, 64), (2, 1, 1)),
    "small": ((128, 128, 64), (1, 1, 1)),
}
"""The sm90 family's GEMM tile and cluster, by ``_tile_row`` (it runs no f64)."""


def _tile_row(dtype: DType, m: int, n: int) -> str:
    """The row of a family's tile table an ``m x n`` GEMM of ``dtype`` takes: its dtype's
    for f64 and f32 data, else ``"large"`` from ``_LARGE`` output elements or ``"small"``."""
    if dtype is DType.F64 or dtype is DType.F32:
        return dtype.value
    return "large" if m * n >= _LARGE else "small"


def _sm80_gemm(dtype: DType, m: int, n: int, arch: str, align: int,
               bias_axis: str) -> KernelPlan:
    tile, warp = _SM80_TILES[_tile_row(dtype, m, n)]
    if align * dtype.itemsize < 4:  # cp.async moves 4, 8 or 16 bytes: 2-byte loads pipeline
        schedule, stages = "pipelined", 2
    else:
        per_stage = (tile[0] + tile[1]) * tile[2] * dtype.itemsize
        schedule, stages = "multistage", min(_SM80_MAX_STAGES, smem_limit(arch) // per_stage)
    return KernelPlan(PlanKind.GEMM, dtype, arch, tile, (1, 1, 1), schedule, stages, warp=warp,
                      bias_axis=bias_axis, family="sm80", align=align)


def gemm_plan(dtype: DType, m: int, n: int, k: int, arch: str = "sm_90a",
              bias_axis: str = "column", family: str | None = None) -> KernelPlan:
    """The kernel of an ``m x n x k`` GEMM compiled for ``arch``.

    ``family`` (default: ``native_family(arch)``, and ``sm80`` wherever ``sm90`` cannot
    run the problem): ``sm90`` on Hopper, for f16, bf16 and f32 (TF32) whose ``k`` and
    ``n`` are multiples of the 16-byte vector: 16-bit data with at least 2048x2048
    outputs takes a 128x256x64 tile on a 2x1 cluster, smaller ones 128x128x64, f32
    128x128x32; cooperative schedule; as many stages as fit. ``sm80``: 128x128x32 tiles
    (128x256x32 for large 16-bit GEMMs, 128x128x16 with 32x64 warps for f64 on DMMA),
    loads of ``align`` elements (the widest vector dividing ``k`` and ``n``, one for f64:
    any size runs), up to 4 ``cp.async`` stages in the architecture's shared memory, or the
    two-stage pipelined mainloop where a load would be 2 bytes."""
    _dtype(dtype, GEMM_DTYPES, "a CUTLASS GEMM")
    arch = _arch(arch)
    if bias_axis not in ("row", "column"):
        raise InvalidArgument(f"bias_axis must be 'row' or 'column', got {bias_axis!r}")
    # f64: one element a load (CUTLASS's SM80 DMMA thread maps move 8 bytes per access)
    align = 1 if dtype is DType.F64 else vector_alignment(dtype, k, n)
    aligned = align * dtype.itemsize == 16
    if family is None:
        family = native_family(arch) if aligned else "sm80"
    elif family not in FAMILIES:
        raise InvalidArgument(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if family == "sm90":
        _hopper(arch, "the sm90 family")
        if not aligned:
            raise InvalidArgument(
                f"the sm90 family takes f16, bf16 or f32 whose k and n are multiples of "
                f"{16 // dtype.itemsize} (16-byte TMA rows); this GEMM needs the sm80 family")
    else:
        return _sm80_gemm(dtype, m, n, arch, align, bias_axis)
    tile, cluster = _SM90_TILES[_tile_row(dtype, m, n)]
    return KernelPlan(PlanKind.GEMM, dtype, arch, tile, cluster, "cooperative",
                      _stages(tile, dtype.itemsize), bias_axis=bias_axis, align=align)


GROUPED_DTYPES = (DType.F16, DType.BF16)


def grouped_plan(dtype: DType, arch: str = "sm_90a") -> KernelPlan:
    """The ptr-array grouped GEMM kernel (``GroupProblemShape``): 128x128x64 tiles,
    cooperative schedule, one persistent launch over every problem's tiles."""
    _dtype(dtype, GROUPED_DTYPES, "a CUTLASS grouped GEMM")
    tile = (128, 128, 64)
    arch = _hopper(_arch(arch), "a grouped GEMM")
    return KernelPlan(PlanKind.GROUPED, dtype, arch, tile, (1, 1, 1), "cooperative",
                      _stages(tile, dtype.itemsize))


CONV_DTYPES = (DType.F16, DType.BF16, DType.F32)


def conv2d_plan(dtype: DType, arch: str = "sm_90a") -> KernelPlan:
    """The implicit-GEMM forward convolution kernel (NHWC; the ``sm80`` templates on every
    architecture): 128x128 tiles of 64 (16-bit) or 32 (TF32) along the reduction, 64x64
    warp tiles, 3 ``cp.async`` stages."""
    _dtype(dtype, CONV_DTYPES, "a CUTLASS convolution")
    depth = 32 if dtype is DType.F32 else 64
    return KernelPlan(PlanKind.CONV2D, dtype, _arch(arch), (128, 128, depth), (1, 1, 1),
                      "multistage", 3, warp=(64, 64, depth), family="sm80")


FP8_FORMATS = ("e4m3", "e5m2")
"""The fp8 formats an fp8 GEMM's operands may have (``float8_e4m3fn``, ``float8_e5m2``)."""
FP8_OUT_DTYPES = (DType.BF16, DType.F16, DType.F32)
"""The dtypes an fp8 GEMM may store ``D`` in."""
_FP8_LARGE = 4096 * 4096
"""Output elements from which an fp8 GEMM takes a 2x1 cluster (and, with fast
accumulation, the 128x256 tile)."""


def gemm_fp8_plan(dtype: DType, m: int, n: int, k: int, a_format: str = "e4m3",
                  b_format: str = "e4m3", arch: str = "sm_90a", bias_axis: str = "column",
                  fast_accum: bool = False) -> KernelPlan:
    """The kernel of an ``m x n x k`` fp8 GEMM storing ``D`` in ``dtype`` (bf16, f16, f32).

    Default (``fast_accum=False``): CUTLASS's cooperative warp-specialized schedule that
    promotes the tensor cores' reduced-precision fp8 accumulator into f32 registers every
    few k-blocks (what ``torch._scaled_mm`` does by default); 128x128x128 tiles, on a 2x1
    cluster from 4096x4096 outputs (a 128x256 tile's two accumulators spill registers:
    measured at 454 TFLOP/s against 1087 for this one on the H100). ``fast_accum=True``:
    the schedule that keeps the whole sum in the fp8 accumulator, 128x256x128 tiles on a
    2x1 cluster from 4096x4096 outputs (1404 TFLOP/s at 8192^3), less accurate. As many
    stages as fit."""
    _dtype(dtype, FP8_OUT_DTYPES, "an fp8 GEMM's output")
    for name, fmt in (("a_format", a_format), ("b_format", b_format)):
        if fmt not in FP8_FORMATS:
            raise InvalidArgument(f"{name} must be 'e4m3' or 'e5m2', got {fmt!r}")
    if not isinstance(fast_accum, bool):
        raise InvalidArgument(f"fast_accum must be a bool, got {fast_accum!r}")
    arch = _hopper(_arch(arch), "an fp8 GEMM")
    if bias_axis not in ("row", "column"):
        raise InvalidArgument(f"bias_axis must be 'row' or 'column', got {bias_axis!r}")
    large = m * n >= _FP8_LARGE
    tile = (128, 256, 128) if large and fast_accum else (128, 128, 128)
    cluster = (2, 1, 1) if large else (1, 1, 1)
    per_stage = (tile[0] + tile[1]) * tile[2] + _STAGE_BARRIER
    stages = min(_MAX_STAGES, (SMEM_BYTES - _EPILOGUE_RESERVE[dtype.itemsize]) // per_stage)
    schedule = "cooperative_fastaccum" if fast_accum else "cooperative"
    return KernelPlan(PlanKind.GEMM_FP8, dtype, arch, tile, cluster, schedule, stages,
                      bias_axis=bias_axis, formats=(a_format, b_format))
