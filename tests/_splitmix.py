"""The hash behind Dropout's documented masks, in plain Python integers (the tests' oracle)."""

from __future__ import annotations

MASK64 = (1 << 64) - 1


def splitmix64(z: int) -> int:
    """SplitMix64's output function of ``z + gamma``, wrapping at 64 bits."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)
