"""``TorchModule``: a ``torch.nn.Module`` as the model of a ``DataParallelTrainer``.

Each replica holds its own copy of the module on its device, and forward and
backward run in torch there. The gradients go through the trainer's
collectives, not torch's: every parameter's ``.grad`` is a view into one of a
few flat gradient buckets (parameters in reverse declaration order, so the
bucket backward fills first is bucket 0), and those buckets are device buffers
of ours. On a CUDA device (thread host) a bucket is one allocation of ours that
torch uses in place, shared through DLPack (no copy); a post-accumulate hook
per parameter records a CUDA event when a bucket is complete, so its
all-reduce starts while backward still runs. On the CPU backend torch runs on
the CPU and a bucket is copied into its buffer (and back) around the
all-reduce. The optimizer step is **torch's** (``torch.optim.SGD`` / ``Adam`` /
``AdamW`` built from our optimizer description with the same hyperparameters;
fused kernels on CUDA), with our schedule's learning rate set before every
step. torch is imported only when a ``TorchModule`` is made.
"""

from __future__ import annotations

import copy
import importlib
import io
from typing import Any

from atomr_accel.core._errors import InvalidArgument, LibraryUnavailable

__all__ = ["BUCKET_BYTES", "TorchModule"]

BUCKET_BYTES = 25 << 20
"""The default size of a gradient bucket, bytes (DDP's default, 25 MiB)."""


def import_torch() -> Any:
    """The ``torch`` module; ``LibraryUnavailable`` naming the package when it is missing."""
    try:
        return importlib.import_module("torch")
    except Exception as exc:  # ImportError, or a loader error from a missing shared library
        raise LibraryUnavailable("torch", "torch", "torch", str(exc)) from exc


class TorchModule:
    """A ``torch.nn.Module`` to train with ``DataParallelTrainer`` (see the module doc).

    ``module`` is copied (``copy.deepcopy``) to each replica's device, so every
    replica starts from its parameters; the module given is never changed.
    Its parameters must be float32. ``bucket_bytes`` caps a gradient bucket.
    """

    def __init__(self, module: Any, *, bucket_bytes: int = BUCKET_BYTES) -> None:
        torch = import_torch()
        if not isinstance(module, torch.nn.Module):
            raise InvalidArgument(f"TorchModule wraps a torch.nn.Module, got "
                                  f"{type(module).__name__}")
        parameters = [p for p in module.parameters() if p.requires_grad]
        if not parameters:
            raise InvalidArgument("the module has no trainable parameters")
        for name, p in module.named_parameters():
            if p.requires_grad and p.dtype != torch.float32:
                raise InvalidArgument(f"parameter {name} is {p.dtype}; TorchModule trains "
                                      "float32 parameters")
        if (not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool)
                or bucket_bytes < 4):
            raise InvalidArgument(f"bucket_bytes must be an int >= 4, got {bucket_bytes!r}")
        self._module = copy.deepcopy(module).cpu()
        self.bucket_bytes = bucket_bytes

    def copy_module(self) -> Any:
        """A fresh copy of the module (on the CPU), for one replica."""
        return copy.deepcopy(self._module)

    def in_features(self) -> int | None:
        """The row width the module takes, when its first parameter-holding layer is a
        ``torch.nn.Linear`` (else None: any width is passed through to torch)."""
        torch = import_torch()
        for layer in self._module.modules():
            if isinstance(layer, torch.nn.Linear):
                return int(layer.in_features)
            if next(layer.parameters(recurse=False), None) is not None:
                return None
        return None

    def __getstate__(self) -> dict[str, Any]:
        torch = import_torch()
        buffer = io.BytesIO()
        torch.save(self._module, buffer)
        return {"module": buffer.getvalue(), "bucket_bytes": self.bucket_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        torch = import_torch()
        self._module = torch.load(io.BytesIO(state["module"]), weights_only=False)
        self.bucket_bytes = state["bucket_bytes"]

    def __repr__(self) -> str:
        return f"TorchModule({type(self._module).__name__}, bucket_bytes={self.bucket_bytes})"
