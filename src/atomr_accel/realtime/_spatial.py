"""SpatialIndexActor: radius search over 3-D points through a uniform-grid hash built on a
device by sorting the points by cell."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from atomr_accel.agents._client import blocking_twin, require_timeout
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._realtime_physics import GridBuild, GridQuery
from atomr_accel.facade import Device, System
from atomr_accel.facade._buffers import GpuBuffer
from atomr_accel.realtime._simulation import (
    F32Array,
    SimulationActor,
    SimulationClient,
    as_points,
    require_number,
)

__all__ = ["SpatialIndexActor"]

QUERY_TIMEOUT = 2.0
"""The default ``timeout_secs`` of queries (the original's), seconds."""
TIMEOUT = 5.0
"""The default ``timeout_secs`` of the other calls, seconds."""
_MIN_TABLE = 1024


@dataclass(frozen=True, slots=True)
class _Insert:
    points: F32Array


@dataclass(frozen=True, slots=True)
class _Query:
    points: F32Array
    radius: float | None


class _Rebuild:
    __slots__ = ()


class _Count:
    __slots__ = ()


class _SpatialActor(SimulationActor):
    """Holds the points, the sorted order and the slot ranges on the device; rebuilds the
    grid before a query when points came in since the last build."""

    def __init__(self, system: System, device: Device | None, cell_size: float,
                 table_size: int | None) -> None:
        super().__init__(system, device, 0)
        self.cell_size = cell_size
        self.fixed_table = table_size
        self.count = 0
        self.capacity = 0
        self.dirty = True
        self.table_size = 0
        self.points: GpuBuffer | None = None
        self.order: GpuBuffer | None = None
        self.start: GpuBuffer | None = None
        self.end: GpuBuffer | None = None
        self.queries: GpuBuffer | None = None

    async def handle(self, message: Any) -> Any:
        cls = type(message)
        if cls is _Query:
            return await self._query(message.points, message.radius)
        if cls is _Insert:
            return await self._insert(message.points)
        if cls is _Rebuild:
            await self._rebuild()
            return self.count
        if cls is _Count:
            return self.count
        return await super().handle(message)

    async def _insert(self, points: F32Array) -> range:
        n, first, dev = len(points), self.count, self.device
        if first + n > self.capacity:
            size = max(first + n, 2 * self.capacity, _MIN_TABLE)
            grown = await self.allocate(3 * size)
            if self.points is not None:
                if first:
                    await dev.copy_async(self.points, grown, 3 * first)
                await self.release(self.points)
            if self.order is not None:
                await self.release(self.order)
            self.points, self.capacity = grown, size
            self.order = await self.allocate(size, DType.I32)
        assert self.points is not None
        if n:
            await dev.copy_from_numpy_async(self.points, points.ravel(), 3 * first)
            self.count += n
            self.dirty = True
        return range(first, first + n)

    async def _rebuild(self) -> None:
        dev = self.device
        table = self.fixed_table or max(_MIN_TABLE, 1 << (2 * max(self.count, 1) - 1).bit_length())
        if table != self.table_size:
            for old in (self.start, self.end):
                if old is not None:
                    await self.release(old)
            self.start = await self.allocate(table, DType.I32)
            self.end = await self.allocate(table, DType.I32)
            self.table_size = table
        if self.count:
            assert self.points is not None and self.order is not None
            assert self.start is not None and self.end is not None
            await dev.run_async(GridBuild(
                dev.ref_of(self.points), dev.ref_of(self.order), dev.ref_of(self.start),
                dev.ref_of(self.end), self.count, table, self.cell_size))
        self.dirty = False

    async def _query(self, queries: F32Array, radius: float | None) -> list[list[int]]:
        if self.count == 0 or len(queries) == 0:
            return [[] for _ in range(len(queries))]
        if self.dirty:
            await self._rebuild()
        dev = self.device
        if self.queries is None or len(self.queries) < queries.size:
            if self.queries is not None:
                await self.release(self.queries)
            self.queries = await self.allocate(max(queries.size, 3 * 64))
        await dev.copy_from_numpy_async(self.queries, queries.ravel(), 0)
        assert self.points is not None and self.order is not None
        assert self.start is not None and self.end is not None
        found = await dev.run_async(GridQuery(
            dev.ref_of(self.points), dev.ref_of(self.order), dev.ref_of(self.start),
            dev.ref_of(self.end), dev.ref_of(self.queries), self.count, self.table_size,
            self.cell_size, len(queries), self.cell_size if radius is None else radius))
        return [hits.tolist() for hits in found]


class SpatialIndexActor(SimulationClient):
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
        if table_size is not None and (not isinstance(table_size, int)
                                       or isinstance(table_size, bool) or table_size < 1):
            raise InvalidArgument(f"table_size must be an int >= 1 or None, got {table_size!r}")
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
        return self._call(_Insert(as_points(points, "points")), require_timeout(timeout_secs),
                          "insert")

    def rebuild_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """Build the grid of every point now; answers how many points it holds."""
        return self._call(_Rebuild(), require_timeout(timeout_secs), "rebuild")

    def count_async(self, timeout_secs: float = TIMEOUT) -> Coroutine[Any, Any, int]:
        """How many points the index holds."""
        return self._call(_Count(), require_timeout(timeout_secs), "count")

    async def query_neighbors_async(self, x: float, y: float, z: float,
                                    radius: float | None = None,
                                    timeout_secs: float = QUERY_TIMEOUT) -> list[int]:
        """The ids of the points within ``radius`` (default ``cell_size``) of ``(x, y, z)``,
        ascending."""
        point = as_points([x, y, z], "point")
        found: list[list[int]] = await self._call(
            _Query(point, self._radius(radius)), require_timeout(timeout_secs),
            "query_neighbors")
        return found[0]

    def query_many_async(self, points: Any, radius: float | None = None,
                         timeout_secs: float = QUERY_TIMEOUT,
                         ) -> Coroutine[Any, Any, list[list[int]]]:
        """``query_neighbors`` of each row of ``points`` (``(q, 3)``), in one request."""
        return self._call(_Query(as_points(points, "points"), self._radius(radius)),
                          require_timeout(timeout_secs), "query_many")

    insert = blocking_twin(insert_async)
    rebuild = blocking_twin(rebuild_async)
    count = blocking_twin(count_async)
    query_neighbors = blocking_twin(query_neighbors_async)
    query_many = blocking_twin(query_many_async)
