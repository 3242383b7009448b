"""Where each id's vector lives: rows ``0 .. count-1`` of a matrix, kept dense."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from atomr_accel.agents._vectors import I64, UnknownVectorId

__all__ = ["Slots"]


class Slots:
    """The rows of a dense matrix of vectors and the id held in each row.

    New ids take the rows after the last; a removed id's row is filled by the
    last row (so rows stay ``0 .. count-1``). The id array grows geometrically
    (amortized O(1) a new id).
    """

    def __init__(self) -> None:
        self.count = 0
        self.ids: I64 = np.zeros(16, dtype=np.int64)
        self.rows: dict[int, int] = {}

    def assign(self, ids: Sequence[int]) -> tuple[list[tuple[int, int]], int]:
        """Give each of ``ids`` (distinct) a row: return ``(replaced, first_new)``.

        ``replaced`` pairs the position in ``ids`` and the row of each id already
        held (upsert); the other ids, in order, take the rows from ``first_new``
        on (``count`` grows by their number).
        """
        replaced: list[tuple[int, int]] = []
        fresh: list[int] = []
        for position, vector_id in enumerate(ids):
            row = self.rows.get(vector_id)
            if row is None:
                fresh.append(vector_id)
            else:
                replaced.append((position, row))
        first_new = self.count
        needed = first_new + len(fresh)
        if needed > len(self.ids):
            grown = np.zeros(max(needed, 2 * len(self.ids)), dtype=np.int64)
            grown[:first_new] = self.ids[:first_new]
            self.ids = grown
        self.ids[first_new:needed] = fresh
        for offset, vector_id in enumerate(fresh):
            self.rows[vector_id] = first_new + offset
        self.count = needed
        return replaced, first_new

    def remove(self, vector_id: int) -> tuple[int, int]:
        """Free ``vector_id``'s row: return ``(row, last)``, the last row moving into ``row``.

        When ``row == last`` nothing moves. Raises ``UnknownVectorId``.
        """
        row = self.rows.pop(vector_id, None)
        if row is None:
            raise UnknownVectorId(vector_id)
        last = self.count - 1
        if row != last:
            moved = int(self.ids[last])
            self.ids[row] = moved
            self.rows[moved] = row
        self.count = last
        return row, last

    def held(self) -> I64:
        """The ids of rows ``0 .. count-1`` (a view)."""
        return self.ids[: self.count]

    def clear(self) -> None:
        """Hold no id."""
        self.count = 0
        self.rows.clear()
