"""Losses, optimizers and learning-rate schedules: plain, picklable descriptions.

Their arithmetic runs on the device as the ``train`` library's ops
(``core.ops._train``); the formulas are PyTorch's:

* ``MSELoss()``: ``mean((pred - target)**2)`` over every element.
* ``CrossEntropyLoss(label_smoothing=0.0)``: softmax fused with the negative
  log-likelihood of integer labels, mean over the batch; with smoothing ``s``
  over ``C`` classes the target is ``(1 - s) * onehot + s / C``.
* ``SGD(lr, momentum=0.0, nesterov=False, weight_decay=0.0)``: ``g += wd * p``;
  with momentum ``buf = g`` on the first step, then ``buf = momentum * buf +
  g``; ``g = g + momentum * buf`` (nesterov) or ``buf``; ``p -= lr * g``.
* ``Adam(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)``: ``g +=
  wd * p`` (L2); ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``; ``p -=
  lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.
* ``AdamW(..., weight_decay=1e-2)``: as Adam without the L2 term, and ``p *=
  1 - lr * wd`` first (decoupled decay).

``schedule=WarmupCosine(warmup_steps, total_steps, min_lr=0.0)`` scales the
learning rate of update ``s`` (0 for the first update): ``lr * (s + 1) /
warmup_steps`` while ``s < warmup_steps``, then ``min_lr + (lr - min_lr) * (1 +
cos(pi * q)) / 2`` with ``q = min(1, (s - warmup_steps) / max(1, total_steps -
warmup_steps))``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import is_int

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "CrossEntropyLoss",
    "Loss",
    "MSELoss",
    "Optimizer",
    "WarmupCosine",
    "require_loss",
    "require_optimizer",
]


def _number(name: str, value: object, *, least: float = 0.0, below: float | None = None,
            open_low: bool = False) -> float:
    """``value`` as a finite float in ``[least, below)`` (``(least, below)`` if ``open_low``)."""
    if (not isinstance(value, int | float) or isinstance(value, bool)
            or not math.isfinite(value) or value < least or (open_low and value == least)
            or (below is not None and value >= below)):
        span = f"{'(' if open_low else '['}{least}, {below if below is not None else 'inf'})"
        raise InvalidArgument(f"{name} must be a number in {span}, got {value!r}")
    return float(value)


class Loss:
    """Base of the loss descriptions."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class MSELoss(Loss):
    """Mean squared error over every element; targets are floats shaped like the output."""


@dataclass(frozen=True, slots=True)
class CrossEntropyLoss(Loss):
    """Softmax cross-entropy of integer class labels, mean over the batch; the target is
    ``(1 - label_smoothing) * onehot + label_smoothing / classes``."""

    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "label_smoothing",
                           _number("label_smoothing", self.label_smoothing, below=1.0))


def require_loss(loss: object) -> Loss:
    """``loss`` if it is a ``Loss``; ``InvalidArgument`` else."""
    if not isinstance(loss, Loss):
        raise InvalidArgument(f"loss must be MSELoss() or CrossEntropyLoss(), got {loss!r:.60}")
    return loss


@dataclass(frozen=True, slots=True)
class WarmupCosine:
    """Linear warm-up over ``warmup_steps`` updates, then a cosine decay to ``min_lr`` at
    ``total_steps`` (held there after); see the module for the formula."""

    warmup_steps: int
    total_steps: int
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if not is_int(self.warmup_steps) or self.warmup_steps < 0:
            raise InvalidArgument(f"warmup_steps must be an int >= 0, got "
                                  f"{self.warmup_steps!r}")
        if not is_int(self.total_steps) or self.total_steps < max(1, self.warmup_steps):
            raise InvalidArgument(f"total_steps must be an int >= max(1, warmup_steps), got "
                                  f"{self.total_steps!r}")
        object.__setattr__(self, "min_lr", _number("min_lr", self.min_lr))

    def lr(self, base_lr: float, step: int) -> float:
        """The learning rate of update ``step`` (0 for the first) for a base rate ``base_lr``."""
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + (base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _schedule(value: object) -> WarmupCosine | None:
    if value is not None and not isinstance(value, WarmupCosine):
        raise InvalidArgument(f"schedule must be a WarmupCosine or None, got {value!r}")
    return value


class Optimizer:
    """Base of the optimizer descriptions: ``lr`` and an optional ``schedule``."""

    __slots__ = ()
    lr: float
    schedule: WarmupCosine | None

    def lr_at(self, step: int) -> float:
        """The learning rate of update ``step`` (0 for the first)."""
        return self.lr if self.schedule is None else self.schedule.lr(self.lr, step)

    @property
    def state_names(self) -> tuple[str, ...]:
        """The per-parameter state buffers the optimizer keeps (torch's names)."""
        return ()


def require_optimizer(optimizer: object) -> Optimizer:
    """``optimizer`` if it is an ``Optimizer``; ``InvalidArgument`` else."""
    if not isinstance(optimizer, Optimizer):
        raise InvalidArgument(f"optimizer must be SGD, Adam or AdamW, got {optimizer!r:.60}")
    return optimizer


@dataclass(frozen=True, slots=True)
class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight
    decay, as ``torch.optim.SGD`` (dampening 0)."""

    lr: float
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: WarmupCosine | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number("lr", self.lr))
        object.__setattr__(self, "momentum", _number("momentum", self.momentum))
        object.__setattr__(self, "weight_decay", _number("weight_decay", self.weight_decay))
        if not isinstance(self.nesterov, bool):
            raise InvalidArgument(f"nesterov must be a bool, got {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise InvalidArgument("nesterov momentum needs momentum > 0")
        _schedule(self.schedule)

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()


def _betas(value: object) -> tuple[float, float]:
    if not (isinstance(value, tuple | list) and len(value) == 2):
        raise InvalidArgument(f"betas must be two numbers in [0, 1), got {value!r}")
    return (_number("betas[0]", value[0], below=1.0), _number("betas[1]", value[1], below=1.0))


@dataclass(frozen=True, slots=True)
class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay (added to the gradient), as
    ``torch.optim.Adam``."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: WarmupCosine | None = field(default=None, kw_only=True)

    decoupled = False
    """Whether the weight decay is decoupled (AdamW) rather than L2."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _number("lr", self.lr))
        object.__setattr__(self, "betas", _betas(self.betas))
        object.__setattr__(self, "eps", _number("eps", self.eps, open_low=True))
        object.__setattr__(self, "weight_decay", _number("weight_decay", self.weight_decay))
        _schedule(self.schedule)

    @property
    def state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True, slots=True)
class AdamW(Adam):
    """Adam with bias correction and decoupled weight decay (``p *= 1 - lr * wd`` before the
    update), as ``torch.optim.AdamW``."""

    weight_decay: float = 1e-2

    decoupled = True
    """Whether the weight decay is decoupled (AdamW) rather than L2."""
