"""Fused matmuls: the ``BlasLt`` handle (``dev.blaslt()``), its epilogues and the size
of the auxiliary buffer that carries a forward pass's activation input to the
backward epilogues.

Written from ``atomr_accel.original`` by ``python -m atomr_accel.original``; edit the
declaration there, not this file.
"""

from atomr_accel import BlasLt
from atomr_accel._public import publish as _publish
from atomr_accel.core.ops._blaslt import Epilogue, aux_len, gelu_aux_ld, relu_aux_ld

__all__ = ["BlasLt", "Epilogue", "aux_len", "gelu_aux_ld", "relu_aux_ld"]

_publish(__name__)
