"""``System.shard``: rendezvous hashing moves only the keys of a device that comes or goes.

Sharding needs no Ray: these run on thread-hosted CPU devices (the cluster's
devices are sharded the same way, see test_ray_cluster.py).
"""

from __future__ import annotations

import random

import pytest

from atomr_accel import DeviceUnavailable, InvalidArgument, System

KEYS = 10_000


def owners(system: System, keys: list[str], devices: list[object] | None = None) -> list[str]:
    return [system.shard(k, devices).ref.name for k in keys]  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def keys() -> list[str]:
    rng = random.Random(19)
    return [f"user-{rng.getrandbits(64):016x}" for _ in range(KEYS)]


def test_removing_one_of_n_devices_moves_only_its_keys(keys: list[str]) -> None:
    n = 5
    with System.open("shard") as system:
        devices = [system.spawn_device(i, mock=True, libraries=()) for i in range(n)]
        before = owners(system, keys)
        counts = {d.ref.name: before.count(d.ref.name) for d in devices}
        assert all(KEYS / n / 2 < c < KEYS / n * 2 for c in counts.values()), counts
        leaving = devices[2]
        system.drop_device(leaving)
        after = owners(system, keys)
        moved = [i for i in range(KEYS) if before[i] != after[i]]
        assert len(moved) <= 1.5 * KEYS / n
        assert all(before[i] == leaving.ref.name for i in moved)  # only its own keys
        assert leaving.ref.name not in after


def test_adding_a_device_takes_about_one_in_n_plus_one_keys(keys: list[str]) -> None:
    n = 4
    with System.open("shard") as system:
        devices = [system.spawn_device(i, mock=True, libraries=()) for i in range(n)]
        before = owners(system, keys, devices)
        newcomer = system.spawn_device(n, mock=True, libraries=())
        after = owners(system, keys, [*devices, newcomer])
        moved = [i for i in range(KEYS) if before[i] != after[i]]
        assert 0 < len(moved) <= 1.5 * KEYS / (n + 1)
        assert all(after[i] == newcomer.ref.name for i in moved)  # all to the newcomer


def test_keys_of_every_kind_are_stable_and_bad_keys_are_refused() -> None:
    with System.open("shard") as system:
        devices = [system.spawn_device(i, mock=True, libraries=()) for i in range(3)]
        for key in ("a", b"a", 7, -1, ""):
            assert system.shard(key) is system.shard(key)
        for bad in (1.5, None, ("a",), True):
            with pytest.raises(InvalidArgument):
                system.shard(bad)  # type: ignore[arg-type]
        for device in devices:
            system.drop_device(device)
        with pytest.raises(DeviceUnavailable):
            system.shard("a")
