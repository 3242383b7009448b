"""Backends: where ops actually run. ``cpu`` (NumPy/SciPy) is the reference."""
