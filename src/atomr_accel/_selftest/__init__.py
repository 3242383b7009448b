"""A smoke suite shipped in the package, for ``atomr-accel test`` where no checkout's
``tests/`` is at hand (an installed wheel): devices and buffers, BLAS against NumPy, typed
errors, fault recovery, op tracing; on a GPU, CUDA against the CPU backend.

Run it with ``atomr-accel test --smoke`` (or ``pytest --pyargs atomr_accel._selftest``).
"""
