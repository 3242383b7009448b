"""atomr-accel: an actor-shaped face for GPU compute."""

__version__ = "0.1.0"
