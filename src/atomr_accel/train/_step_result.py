"""What a data-parallel step answers: the loss as a float that also unpacks as the
original package's ``(loss, grad_norm, step_micros)``."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["StepResult"]


class StepResult(float):
    """The mean loss of one training step over its whole global batch.

    It is a ``float`` (``loss = trainer.step(x, y)``) and unpacks as the
    original package's triple (``loss, grad_norm, step_micros = trainer.step(batch)``):
    ``grad_norm`` is the L2 norm of the global gradient (every parameter's,
    after the all-reduce, before the optimizer step) and ``step_micros`` the
    step's wall time in microseconds (recoveries included). ``recovered``
    counts the replicas rebuilt during this step.
    """

    grad_norm: float
    step_micros: int
    recovered: int

    def __new__(cls, loss: float, grad_norm: float, step_micros: int,
                recovered: int = 0) -> StepResult:
        """Make the result of a step whose loss is ``loss``."""
        self = super().__new__(cls, loss)
        self.grad_norm = float(grad_norm)
        self.step_micros = int(step_micros)
        self.recovered = int(recovered)
        return self

    @property
    def loss(self) -> float:
        """The loss as a plain float."""
        return float(self)

    def __iter__(self) -> Iterator[float | int]:
        """``loss, grad_norm, step_micros`` (the original package's tuple)."""
        return iter((float(self), self.grad_norm, self.step_micros))

    def __len__(self) -> int:
        """3, as the original's tuple."""
        return 3

    def __getitem__(self, index: int) -> float | int:
        """The original's tuple by index: 0 loss, 1 grad_norm, 2 step_micros."""
        return (float(self), self.grad_norm, self.step_micros)[index]

    def __repr__(self) -> str:
        return (f"StepResult(loss={float(self)!r}, grad_norm={self.grad_norm!r}, "
                f"step_micros={self.step_micros})")

    def __reduce__(self) -> tuple[type[StepResult], tuple[float, float, int, int]]:
        return (StepResult, (float(self), self.grad_norm, self.step_micros, self.recovered))
