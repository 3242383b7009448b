"""Realtime simulations and frame pipelines as supervised actors bound to a device.

Each step runs as ops of the device's ``realtime`` library: NVRTC kernels on
CUDA, NumPy on the CPU backend (the reference the GPU results are checked
against).
"""

from __future__ import annotations

from atomr_accel.realtime._cloth import ClothSimulationActor
from atomr_accel.realtime._fluid import FluidSimulationActor
from atomr_accel.realtime._particles import ParticleSystemActor
from atomr_accel.realtime._spatial import SpatialIndexActor

__all__: list[str] = [
    "ClothSimulationActor",
    "FluidSimulationActor",
    "ParticleSystemActor",
    "SpatialIndexActor",
]
