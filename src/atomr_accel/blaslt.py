"""Fused matmuls: the ``BlasLt`` handle (``dev.blaslt()``), its epilogues and the size of the
auxiliary buffer that carries a forward pass's activation input to the backward epilogues."""

from atomr_accel.core.ops._blaslt import Epilogue, aux_len, gelu_aux_ld, relu_aux_ld
from atomr_accel.facade._dnn import BlasLt

__all__ = ["BlasLt", "Epilogue", "aux_len", "gelu_aux_ld", "relu_aux_ld"]
