"""The host memory the CPU backend reports as its device memory.

A CPU "device" keeps its buffers in host memory, so its total is the host's
physical memory and its free memory what the host can still give: Linux's
``MemAvailable`` (``/proc/meminfo``). A memory cgroup limit (v2
``memory.max``, v1 ``memory.limit_in_bytes``, on the process's own cgroup and
every one above it) bounds both: the total by the limit, the free memory by
the room left under it. Elsewhere ``os.sysconf`` answers. The readings are
plain text; the parsers below do no I/O.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cgroup_dirs", "host_memory", "meminfo_bytes", "read_limit"]

_PROC = Path("/proc")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_V2_FILES = ("memory.max", "memory.current")
_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes")


def meminfo_bytes(text: str) -> dict[str, int]:
    """The sizes of ``/proc/meminfo`` in bytes, by name (``MemTotal``, ``MemAvailable``, ...)."""
    sizes = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            unit = 1024 if fields[1:] == ["kB"] else 1
            sizes[name.strip()] = int(fields[0]) * unit
    return sizes


def cgroup_dirs(self_cgroup: str, root: Path) -> list[tuple[Path, tuple[str, str]]]:
    """The memory cgroup directories of a process, its own first and then each parent.

    ``self_cgroup`` is the text of ``/proc/self/cgroup`` and ``root`` the
    cgroup mount (``/sys/fs/cgroup``). Each entry pairs a directory with the
    names of its limit and usage files (v1 or v2). Directories that do not
    exist are left out.
    """
    found: list[tuple[Path, tuple[str, str]]] = []
    for line in self_cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            base, files = root, _V2_FILES
        elif "memory" in controllers.split(","):
            base, files = root / "memory", _V1_FILES
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            folder = base.joinpath(*parts[:depth])
            if (folder / files[0]).is_file():
                found.append((folder, files))
    return found


def read_limit(folder: Path, files: tuple[str, str], physical: int) -> tuple[int, int] | None:
    """``(limit, room)`` in bytes of one cgroup directory, or None without a limit.

    A limit of ``max`` or at least ``physical`` (v1 writes a huge number) is no limit.
    """
    try:
        limit_text = (folder / files[0]).read_text().strip()
        usage = int((folder / files[1]).read_text().strip())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= physical:
        return None
    limit = int(limit_text)
    return limit, max(0, limit - usage)


def host_memory(proc: Path = _PROC, cgroup_root: Path = _CGROUP_ROOT) -> tuple[int, int]:
    """``(free, total)`` bytes of the host for this process, read now.

    Total: physical memory, bounded by the tightest memory cgroup limit. Free:
    ``MemAvailable``, bounded by the room left under each limit.
    """
    try:
        sizes = meminfo_bytes((proc / "meminfo").read_text())
        total, free = sizes["MemTotal"], sizes["MemAvailable"]
    except (OSError, KeyError):
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
        free = os.sysconf("SC_AVPHYS_PAGES") * page if "SC_AVPHYS_PAGES" in os.sysconf_names \
            else total
    try:
        folders = cgroup_dirs((proc / "self" / "cgroup").read_text(), cgroup_root)
    except OSError:
        folders = []
    for folder, files in folders:
        bound = read_limit(folder, files, total)
        if bound is not None:
            total, free = min(total, bound[0]), min(free, bound[1])
    return max(0, min(free, total)), total
