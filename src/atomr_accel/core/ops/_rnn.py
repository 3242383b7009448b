"""cuDNN-shaped recurrent networks: RNN (tanh/relu), LSTM and GRU."""

from __future__ import annotations

__all__: list[str] = []
