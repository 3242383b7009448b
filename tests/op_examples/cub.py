"""One valid example of each op of the ``cub`` library."""

from __future__ import annotations

from typing import Any

from atomr_accel.core import DType
from atomr_accel.core.ops._cub import (
    CubHistogramEven,
    CubHistogramRange,
    CubReduce,
    CubRunLengthEncode,
    CubScan,
    CubSegmentedReduce,
    CubSegmentedSort,
    CubSelect,
    CubSort,
    CubUnique,
    ReduceKind,
    ScanKind,
)
from op_examples import buf

F32, F64, I32, U8 = DType.F32, DType.F64, DType.I32, DType.U8

EXAMPLES: list[Any] = [
    CubReduce(buf(I32, 9, 41), buf(I32, 1, 42), 8, ReduceKind.CUSTOM, "a > b ? a : b", -5.0),
    CubScan(buf(F32, 9, 41), buf(F64, 9, 42), None, ScanKind.SUM, exclusive=True),
    CubSort(buf(DType.U32, 9, 41), buf(DType.U32, 9, 42), 9, buf(F32, 9, 43),
            buf(F32, 9, 44), descending=True, begin_bit=4, end_bit=20),
    CubHistogramEven(buf(F32, 9, 41), buf(I32, 4, 42), 4, -1.0, 2.5),
    CubHistogramRange(buf(F32, 9, 41), buf(F32, 5, 42), buf(DType.U64, 4, 43), 4, 7),
    CubSelect(buf(F64, 9, 41), buf(F64, 9, 42), buf(DType.I64, 1, 43), None,
              predicate="x > 0.5 && x < 2", partition=True),
    CubUnique(buf(U8, 9, 41), buf(U8, 9, 42), buf(I32, 1, 43), 6),
    CubRunLengthEncode(buf(I32, 9, 41), buf(I32, 9, 42), buf(DType.U32, 9, 43),
                       buf(DType.I64, 1, 44)),
    CubSegmentedReduce(buf(F32, 9, 41), buf(F32, 3, 42), buf(DType.I64, 4, 43), 3,
                       ReduceKind.MAX),
    CubSegmentedSort(buf(F32, 9, 41), buf(F32, 9, 42), buf(I32, 4, 43), 3, 9,
                     buf(I32, 9, 44), buf(I32, 9, 45), descending=True),
]
