"""Realtime simulations and frame pipelines as supervised actors bound to a device.

Each step runs as ops of the device's ``realtime`` library: NVRTC kernels on
CUDA, NumPy on the CPU backend (the reference the GPU results are checked
against). Every actor follows one set of rules: it is bound to a device of its
system (named at spawn, or placed by the system when it starts, then fixed;
``device()`` answers it), frees its buffers when it stops, and restarts from
its initial state when the device's context is rebuilt (the call that finds
out fails with ``GpuRefStale``).
"""

from __future__ import annotations

from atomr_accel.core.ops._realtime_data import HashMapFull
from atomr_accel.core.ops._realtime_frames import (
    BoxBlur,
    Correlate,
    GaussianBlur,
    SobelMagnitude,
    Threshold,
)
from atomr_accel.realtime._analysis import (
    FrameStatistics,
    MultiPassAnalysisActor,
    RunningStatistics,
)
from atomr_accel.realtime._cloth import ClothSimulationActor
from atomr_accel.realtime._fluid import FluidSimulationActor
from atomr_accel.realtime._hashmap import GpuHashMapActor
from atomr_accel.realtime._image import ImageFilterPipeline
from atomr_accel.realtime._particles import ParticleSystemActor
from atomr_accel.realtime._sparse import GpuSparseStructureActor
from atomr_accel.realtime._spatial import SpatialIndexActor
from atomr_accel.realtime._video import VideoEffectsGraph

__all__: list[str] = [
    "BoxBlur",
    "ClothSimulationActor",
    "Correlate",
    "FluidSimulationActor",
    "FrameStatistics",
    "GaussianBlur",
    "GpuHashMapActor",
    "GpuSparseStructureActor",
    "HashMapFull",
    "ImageFilterPipeline",
    "MultiPassAnalysisActor",
    "ParticleSystemActor",
    "RunningStatistics",
    "SobelMagnitude",
    "SpatialIndexActor",
    "Threshold",
    "VideoEffectsGraph",
]
