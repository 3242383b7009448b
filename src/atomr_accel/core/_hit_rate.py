"""Judging whether a cache of one kind of value is worth its lookups."""

from __future__ import annotations

__all__ = ["HitRate"]


class HitRate:
    """Whether a cache of one kind of value is worth its lookups: judged every ``TRIAL``
    lookups, it rests for the next ``REST`` values (looks nothing up, keeps nothing) when
    fewer than one in ``1 / WORTH`` found what it looked for. A kind whose values differ
    every time (an RNG fill's offset) so costs its cache almost nothing. Counted without a
    lock: a count lost to a race only shifts a judgement."""

    __slots__ = ("hits", "looks", "rest")
    TRIAL = 256
    REST = 4096
    WORTH = 0.125

    def __init__(self) -> None:
        self.hits = self.looks = self.rest = 0

    def resting(self) -> bool:
        """Whether to skip the cache for this value (counts the rest down)."""
        if self.rest:
            self.rest -= 1
            return True
        return False

    def hit(self) -> None:
        """A lookup found its value."""
        self.looks += 1
        self.hits += 1

    def miss(self) -> None:
        """A lookup found nothing (judges the trial once it is full)."""
        self.looks += 1
        if self.looks >= self.TRIAL:
            if self.hits < self.looks * self.WORTH:
                self.rest = self.REST
            self.hits = self.looks = 0
