"""One valid example of every op class, by library, for the tests that check every op
(``test_op_validation_speed``: validation, pickling, copies; ``test_validation_options``).

Each module here holds one library's examples in ``EXAMPLES``; a new library adds its own
module, so no list is shared (``test_op_validation_speed`` still holds the examples of
the libraries that predate this folder). ``test_examples_cover_every_op_class`` fails
until every op class has an example.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from atomr_accel.core import DType, GpuRef


def buf(dtype: DType, n: int, buffer_id: int = 1, owner: int = 0) -> GpuRef:
    """A reference to buffer ``buffer_id`` of ``n`` elements of ``dtype`` (generation 0)."""
    return GpuRef(0, buffer_id, dtype, n, 0, owner)


def collected() -> list[Any]:
    """The examples of every module of this package, in the order of their names."""
    found: list[Any] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        found.extend(importlib.import_module(f"{__name__}.{info.name}").EXAMPLES)
    return found
