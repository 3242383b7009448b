"""The CPU backend reports the host's real memory (or a configured capacity), and what
does not fit is a typed ``OutOfMemory``: at allocation and at ``memory_fit`` placement."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _ray_hosts import RAY

from atomr_accel import InvalidArgument, OutOfMemory, System
from atomr_accel.backends.cpu._memory import cgroup_dirs, host_memory, meminfo_bytes

HOSTS = ["thread", "process", RAY]
MiB = 1 << 20


def _physical() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def test_meminfo_sizes_are_bytes() -> None:
    text = "MemTotal:       24684084 kB\nMemAvailable:   1000 kB\nHugePages_Total:       0\n"
    assert meminfo_bytes(text) == {"MemTotal": 24684084 * 1024, "MemAvailable": 1024000,
                                   "HugePages_Total": 0}


def _fake_host(tmp_path: Path, cgroup: str, files: dict[str, int | str]) -> Path:
    """A fake /proc (8 GiB, 6 GiB available) and cgroup ``files`` under ``tmp_path / "cg"``."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 6291456 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup)
    for name, value in files.items():
        path = tmp_path / "cg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return proc


def test_without_a_cgroup_limit_the_host_figures_stand(tmp_path: Path) -> None:
    proc = _fake_host(tmp_path, "0::/\n", {"memory.max": "max", "memory.current": 123})
    assert host_memory(proc, tmp_path / "cg") == (6 << 30, 8 << 30)


def test_a_cgroup_v2_limit_bounds_total_and_free(tmp_path: Path) -> None:
    proc = _fake_host(tmp_path, "0::/app/job\n", {
        "memory.max": "max", "memory.current": 0,
        "app/memory.max": 4 << 30, "app/memory.current": 1 << 30,  # 3 GiB of room
        "app/job/memory.max": 5 << 30, "app/job/memory.current": 0,
    })
    assert [p.relative_to(tmp_path / "cg").as_posix()
            for p, _ in cgroup_dirs("0::/app/job\n", tmp_path / "cg")] == ["app/job", "app", "."]
    assert host_memory(proc, tmp_path / "cg") == (3 << 30, 4 << 30)


def test_a_cgroup_v1_limit_bounds_total_and_free(tmp_path: Path) -> None:
    proc = _fake_host(tmp_path, "4:memory:/box\n1:cpu:/\n", {
        "memory/box/memory.limit_in_bytes": 2 << 30,
        "memory/box/memory.usage_in_bytes": 2 << 30,  # full
        "memory/memory.limit_in_bytes": 9223372036854771712,  # v1's "no limit"
        "memory/memory.usage_in_bytes": 0,
    })
    assert host_memory(proc, tmp_path / "cg") == (0, 2 << 30)


@pytest.mark.parametrize("isolation", HOSTS)
def test_a_cpu_device_reports_the_hosts_memory(isolation: str) -> None:
    with System.open("memory") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        free, total = dev.memory_info()
        assert total == host_memory()[1] <= _physical()
        assert 0 < free <= total
        stats = dev.stats()
        assert stats.memory_total == total and stats.memory_free is not None
        assert stats.memory_free <= total


@pytest.mark.parametrize("isolation", HOSTS)
def test_what_does_not_fit_the_host_is_refused_typed(isolation: str) -> None:
    with System.open("memory") as system:
        dev = system.spawn_device(mock=True, isolation=isolation)
        _, total = dev.memory_info()
        too_much = _physical() + (1 << 30)
        with pytest.raises(OutOfMemory) as placing:
            system.place(bytes_needed=too_much, policy="memory_fit")
        assert placing.value.requested == too_much
        with pytest.raises(OutOfMemory) as allocating:
            dev.allocate(too_much, "u8")
        assert allocating.value.requested == too_much
        assert allocating.value.available is not None and allocating.value.available <= total
        dev.allocate(MiB, "u8")  # the device still serves


@pytest.mark.parametrize("isolation", HOSTS)
def test_a_configured_capacity_is_the_device_size(isolation: str) -> None:
    with System.open("memory") as system:
        dev = system.spawn_device(mock=True, isolation=isolation,
                                  backend_options={"capacity": 4 * MiB})
        assert dev.memory_info() == (4 * MiB, 4 * MiB)
        held = dev.allocate(3 * MiB, "u8")  # kept: a dropped buffer may be freed
        assert dev.memory_info() == (MiB, 4 * MiB) and len(held) == 3 * MiB
        with pytest.raises(OutOfMemory):
            dev.allocate(2 * MiB, "u8")
        assert system.place(bytes_needed=MiB, policy="memory_fit") is dev
        with pytest.raises(OutOfMemory):
            system.place(bytes_needed=2 * MiB, policy="memory_fit")


@pytest.mark.parametrize("capacity", [-1, 1.5, "big", True])
def test_a_bad_capacity_is_an_invalid_argument(capacity: object) -> None:
    with System.open("memory") as system, pytest.raises(InvalidArgument, match="capacity"):
        system.spawn_device(mock=True, backend_options={"capacity": capacity})
