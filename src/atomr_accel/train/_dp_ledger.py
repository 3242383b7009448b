"""What a data-parallel trainer keeps outside its replicas so that it can always go back:
the last host checkpoint, the batches trained since, its counters, and the event it
publishes when it rebuilds a replica."""

from __future__ import annotations

from dataclasses import dataclass, field

from atomr_accel.train._model import Array

__all__ = ["Checkpoint", "Ledger", "ReplicaRecovered", "TrainerStats"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A replica's whole state on the host (``state_dict``: parameters, optimizer state,
    step) after ``steps`` trainer steps."""

    steps: int
    state: dict[str, Array]


@dataclass(frozen=True, slots=True)
class ReplicaRecovered:
    """Published on the system's event stream each time a data-parallel trainer rebuilt
    a replica: ``trainer`` (its actor path), ``replica`` (its index), ``device`` (the
    device's name), ``reason`` (the error that broke the step), ``source`` (``"replica
    <i>"`` or ``"checkpoint@<steps>"``: where the state came from), ``step`` (the trainer
    step being run) and ``seconds`` (the wall time of the recovery)."""

    trainer: str
    replica: int
    device: str
    reason: str
    source: str
    step: int
    seconds: float


@dataclass(frozen=True, slots=True)
class TrainerStats:
    """A snapshot of a ``DataParallelTrainer``.

    ``steps``: optimizer steps taken; ``samples``: rows trained on; ``replicas``:
    how many; ``devices``: their names; ``recoveries``: replicas rebuilt after a
    failure; ``redone_steps``: steps run again because a failure broke them;
    ``replayed_steps``: steps replayed from a checkpoint (when no healthy replica
    was left); ``last_recovery_seconds``: wall time of the last recovery (None
    before one); ``checkpoint_step``: the step of the last host checkpoint;
    ``last_loss``: the last step's loss (None before one); ``world_epoch``: the
    communicator generation of the gradient all-reduce (None with one replica);
    ``bucket_count``: gradient buckets all-reduced a step.
    """

    steps: int
    samples: int
    replicas: int
    devices: tuple[str, ...]
    recoveries: int
    redone_steps: int
    replayed_steps: int
    last_recovery_seconds: float | None
    checkpoint_step: int
    last_loss: float | None
    world_epoch: int | None
    bucket_count: int


@dataclass(slots=True)
class Ledger:
    """The trainer's memory that outlives an actor incarnation (it travels in the actor's
    ``Props``, so a restarted actor resumes from it rather than from initial weights).

    ``checkpoint`` is refreshed every ``checkpoint_every`` steps (0: never); ``since``
    holds the batches trained after it, so the state of the last step can be rebuilt
    by replay when no healthy replica is left.
    """

    checkpoint_every: int
    checkpoint: Checkpoint | None = None
    since: list[tuple[Array, Array]] = field(default_factory=list)
    steps: int = 0
    samples: int = 0
    recoveries: int = 0
    redone_steps: int = 0
    replayed_steps: int = 0
    last_recovery_seconds: float | None = None
    last_loss: float | None = None

    def record(self, x: Array, y: Array, loss: float) -> None:
        """Count a finished step over ``(x, y)`` and keep its batch for replay."""
        self.steps += 1
        self.samples += len(x)
        self.last_loss = loss
        if self.checkpoint_every:
            self.since.append((x, y))

    def due(self) -> bool:
        """Whether a checkpoint is due after the step just recorded (never when
        ``checkpoint_every`` is 0)."""
        return bool(self.checkpoint_every) and len(self.since) >= self.checkpoint_every

    def keep(self, state: dict[str, Array]) -> None:
        """Take ``state`` as the checkpoint of the current step; forget older batches."""
        self.checkpoint = Checkpoint(self.steps, state)
        self.since.clear()
