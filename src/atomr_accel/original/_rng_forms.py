"""The original package's random fills (``uniform_f32(buf, lo, hi)``, ``exponential_f64(buf,
lam)`` with a rate, ``uniform_u32(buf)``, ...), attached to ``RngFill``."""

from __future__ import annotations

from atomr_accel.core._api import Form, Param, attach
from atomr_accel.core._dtype import DType
from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core.ops._rng import RngFill, fill_param
from atomr_accel.original._options import REALS

__all__: list[str] = []

_OURS = {form.name: form for form in RngFill.api}
"""Our fills by name: the original's share their fixed fields and say what they draw."""


def _rate(lam: object) -> float:
    """The original's exponential rate as our scale (its mean)."""
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not lam > 0:
        raise InvalidArgument(f"lam must be a rate > 0, got {lam!r}")
    return 1.0 / lam


def _fill(name: str, *params: Param) -> Form:
    """The original's ``name_f32/_f64(buf, *params)``: our fill ``name`` of ``buf``."""
    ours = _OURS[name]
    assert ours.doc is not None
    return Form(name, (Param("buf", to=("out",)), *params), fixed=ours.fixed, dtypes=REALS,
                timeout=10.0, timeout_last=True, doc=ours.doc.replace("``out``", "``buf``", 1),
                note="The original package's form.")


attach(
    RngFill,
    _fill("uniform", fill_param("lo", 0.0), fill_param("hi", 1.0)),
    _fill("normal", fill_param("mean", 0.0), fill_param("std", 1.0)),
    _fill("log_normal", fill_param("mean", 0.0), fill_param("std", 1.0)),
    _fill("poisson", fill_param("lam")),
    _fill("exponential", fill_param("lam", parse=_rate)),
    _fill("beta", fill_param("alpha"), fill_param("beta")),
    _fill("cauchy", fill_param("loc"), fill_param("scale")),
    _fill("gamma", fill_param("shape"), fill_param("scale")),
    _fill("discrete", Param("weights")),
    Form("uniform", (Param("buf", to=("out",)),), dtypes=(DType.U32,), timeout=10.0,
         timeout_last=True, fixed=_OURS["bits"].fixed,
         doc="Fill ``buf`` (u32) with raw 32-bit words, like ``curandGenerate``.",
         note="The original package's form."),
)
