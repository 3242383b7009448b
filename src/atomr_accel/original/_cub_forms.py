"""The original package's CUB method, ``reduce_sum_f32(input, output)``, attached to
``CubReduce``."""

from __future__ import annotations

from atomr_accel.core._api import Form, attach
from atomr_accel.core._dtype import DType
from atomr_accel.core.ops._cub import CubReduce, ReduceKind

__all__: list[str] = []

attach(CubReduce, Form("reduce_sum", ("input", "output"), dtypes=(DType.F32,), timeout=10.0,
                       fixed={"kind": ReduceKind.SUM, "expr": "", "init": 0.0}, timeout_last=True,
                       doc="Sum all of ``input`` into ``output[0]``.",
                       note="The original package's form."))
