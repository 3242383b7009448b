"""The shared-memory helpers the hosts use, re-exported from ``backends/_shm.py`` (where
both the hosts and the backends may reach them)."""

from atomr_accel.backends._shm import (
    SEGMENT_PREFIX,
    SHM_ENV,
    Segment,
    SharedArena,
    ShmSlice,
    create_segment,
    dtype_spec,
    live_segments,
    map_path,
    remove_segment_files,
    shm_dir,
)

__all__ = [
    "SEGMENT_PREFIX",
    "SHM_ENV",
    "Segment",
    "SharedArena",
    "ShmSlice",
    "create_segment",
    "dtype_spec",
    "live_segments",
    "map_path",
    "remove_segment_files",
    "shm_dir",
]
