"""SpatialIndexActor: radius search over 3-D points through a uniform-grid hash built on a
device by sorting the points by cell."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from atomr_accel.blueprint import TIMEOUT, twin
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_physics import GridBuild, GridQuery
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._actor import Placement, RealtimeActor, RealtimeClient
from atomr_accel.realtime._checks import F32Array, as_points, require_count, require_number

__all__ = ["SpatialIndexActor"]

QUERY_TIMEOUT = 2.0
"""The default ``timeout_secs`` of queries (the original's), seconds."""
_MIN_TABLE = 1024


class _SpatialActor(RealtimeActor):
    """Holds the points (``allocate``d, grown by doubling) and the named buffers ``order``,
    ``start``, ``end`` and ``queries`` on the device; rebuilds the grid before a query
    when points came in since the last build."""

    def __init__(self, system: System, placement: Placement, cell_size: float,
                 table_size: int | None) -> None:
        super().__init__(system, placement)
        self.cell_size = cell_size
        self.fixed_table = table_size
        self.count = 0
        self.capacity = 0
        self.dirty = True
        self.table_size = 0
        self.points: GpuBuffer | None = None

    async def on_insert(self, points: F32Array) -> range:
        n, first, dev = len(points), self.count, self.device
        if first + n > self.capacity:
            size = max(first + n, 2 * self.capacity, _MIN_TABLE)
            grown = await self.allocate(3 * size)
            if self.points is not None:
                if first:
                    await dev.copy_async(self.points, grown, 3 * first)
                await self.release(self.points)
            self.points, self.capacity = grown, size
        if n:
            assert self.points is not None
            await dev.copy_from_numpy_async(self.points, points.ravel(), 3 * first)
            self.count += n
            self.dirty = True
        return range(first, first + n)

    async def _grid(self) -> tuple[GpuBuffer, GpuBuffer, GpuBuffer, GpuBuffer]:
        """The points, order, start and end buffers (the last three sized for the table)."""
        assert self.points is not None
        order = await self.buffer("order", self.capacity, DType.I32)
        start = await self.buffer("start", self.table_size, DType.I32)
        end = await self.buffer("end", self.table_size, DType.I32)
        return self.points, order, start, end

    async def on_rebuild(self) -> int:
        self.table_size = self.fixed_table or max(
            _MIN_TABLE, 1 << (2 * max(self.count, 1) - 1).bit_length())
        if self.count:
            dev = self.device
            points, order, start, end = await self._grid()
            await dev.run_async(GridBuild(
                dev.ref_of(points), dev.ref_of(order), dev.ref_of(start), dev.ref_of(end),
                self.count, self.table_size, self.cell_size))
        self.dirty = False
        return self.count

    async def on_count(self) -> int:
        return self.count

    async def on_query_many(self, queries: F32Array, radius: float | None) -> list[list[int]]:
        if self.count == 0 or len(queries) == 0:
            return [[] for _ in range(len(queries))]
        if self.dirty:
            await self.on_rebuild()
        dev = self.device
        held = await self.upload("queries", queries, DType.F32)
        points, order, start, end = await self._grid()
        found = await dev.run_async(GridQuery(
            dev.ref_of(points), dev.ref_of(order), dev.ref_of(start), dev.ref_of(end),
            dev.ref_of(held), self.count, self.table_size, self.cell_size, len(queries),
            self.cell_size if radius is None else radius))
        return [hits.tolist() for hits in found]

    async def on_query_neighbors(self, point: F32Array, radius: float | None) -> list[int]:
        return (await self.on_query_many(point, radius))[0]


class SpatialIndexActor(RealtimeClient):
    """Radius search over 3-D points, through a uniform grid of ``cell_size`` cells hashed
    into a table on a device (``GridBuild``: the points sorted by cell slot).

    Points get the ids 0, 1, 2, ... in insertion order. A query visits only
    the cells within its radius and answers the ids whose distance is at most
    the radius, ascending (equal to a brute-force search). The grid is rebuilt
    on the device before a query when points were inserted since the last
    build (``rebuild`` builds it now). Every method has an ``_async`` twin;
    bad input raises ``InvalidArgument``.
    """

    cell_size = 0.0

    @classmethod
    def spawn(cls, system: Any, cell_size: float, name: str | None = None, *,
              device: Device | None = None, table_size: int | None = None,
              ) -> SpatialIndexActor:
        """Start an empty index of ``cell_size`` cells on ``device`` (None: the system's
        placement picks one); ``table_size`` fixes the hash table's slots (default: a
        power of two at least twice the points, rebuilt as they grow)."""
        size = require_number("cell_size", cell_size, above=0.0)
        require_count("table_size", table_size, least=1, allow_none=True)
        client = cls._spawn(system, _SpatialActor, (size, table_size), name, device)
        client.cell_size = size
        return client

    def _radius(self, radius: Any) -> float | None:
        if radius is None:
            return None
        value = require_number("radius", radius, least=0.0)
        if value > 64 * self.cell_size:
            raise InvalidArgument(f"radius {radius!r} spans more than 64 cells of "
                                  f"{self.cell_size!r}; use a larger cell_size")
        return value

    def insert_async(self, points: Any, timeout_secs: float = TIMEOUT,
                     ) -> Coroutine[Any, Any, range]:
        """Add points (``(n, 3)``, or one ``(3,)``); answers the ids they got."""
        return self._run("insert", (as_points(points, "points"),), timeout_secs)

    insert = twin(insert_async)

    def rebuild_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Build the grid of every point now; answers how many points it holds."""
        return self._run("rebuild", (), timeout_secs)

    rebuild = twin(rebuild_async)

    def count_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """How many points the index holds."""
        return self._run("count", (), timeout_secs)

    count = twin(count_async)

    async def query_neighbors_async(self, x: float, y: float, z: float,
                                    radius: float | None = None,
                                    timeout_secs: float = QUERY_TIMEOUT) -> list[int]:
        """The ids of the points within ``radius`` (default ``cell_size``) of ``(x, y, z)``,
        ascending."""
        point = as_points([x, y, z], "point")
        found: list[int] = await self._run("query_neighbors", (point, self._radius(radius)),
                                           timeout_secs)
        return found

    query_neighbors = twin(query_neighbors_async)

    def query_many_async(self, points: Any, radius: float | None = None,
                         timeout_secs: float = QUERY_TIMEOUT,
                         ) -> Coroutine[Any, Any, list[list[int]]]:
        """``query_neighbors`` of each row of ``points`` (``(q, 3)``), in one request."""
        return self._run("query_many", (as_points(points, "points"), self._radius(radius)),
                         timeout_secs)

    query_many = twin(query_many_async)
