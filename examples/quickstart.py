"""The README's first example, runnable anywhere: ``mock=True`` is the CPU backend.

    python examples/quickstart.py
"""

import numpy as np

from atomr_accel import System

with System.open("gpu-app") as system:
    dev = system.spawn_device(device_id=0, mock=True)
    a = dev.allocate_f32(1024)
    b = dev.allocate_f32(1024)
    c = dev.allocate_f32(1024)
    x = np.random.randn(1024).astype(np.float32)
    y = np.random.randn(1024).astype(np.float32)
    dev.copy_from_numpy(a, x)
    dev.copy_from_numpy(b, y)
    dev.blas().gemm_f32(a, b, c, m=32, n=32, k=32)
    out = dev.copy_to_numpy(c)
    expected = x.reshape(32, 32).T @ y.reshape(32, 32).T  # BLAS is column-major
    error = float(np.abs(out.reshape(32, 32).T - expected).max())
    print(f"gemm 32x32x32 on {dev}: max error vs NumPy {error:.2e}")
