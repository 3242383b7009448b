"""Per-backend state and the LRU cache the CUDA libraries keep their plans and graphs in."""

from __future__ import annotations

import gc

from atomr_accel.backends._state import Lru, per_backend


class _Backend:
    """Stands in for a backend: any weakly referenceable object."""


def test_the_lru_keeps_the_most_recently_used_and_tells_of_each_eviction() -> None:
    dropped: list[tuple[object, str]] = []
    cache: Lru[str] = Lru(2, lambda key, value: dropped.append((key, value)))
    assert cache.get("a", lambda: "A") == "A"
    assert cache.get("b", lambda: "B") == "B"
    assert cache.find("a") == "A"  # now the most recently used
    assert cache.get("a", lambda: "never") == "A"
    assert cache.get("c", lambda: "C") == "C"
    assert dropped == [("b", "B")] and len(cache) == 2
    assert cache.find("b") is None
    cache.clear()
    assert len(cache) == 0 and dropped == [("b", "B")]  # clear tells no one


def test_per_backend_state_is_one_a_backend_and_goes_with_it() -> None:
    made: list[dict[str, int]] = []

    def make() -> dict[str, int]:
        made.append({})
        return made[-1]

    state_of = per_backend(make)
    first, second = _Backend(), _Backend()
    assert state_of(first) is state_of(first) is made[0]
    assert state_of(second) is made[1] and len(made) == 2
    del first
    gc.collect()
    assert state_of(_Backend()) is made[2]  # a new backend, new state
