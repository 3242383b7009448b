"""The base every blueprint builds on: its actor, its client and the one twin rule.

A blueprint is an actor (``BlueprintActor``) with a typed client
(``BlueprintClient``). Every public client operation is declared once, as
``async def name_async(..., timeout_secs=...)``, and ``name = twin(name_async)``
generates its blocking form with the same arguments. A blueprint whose calls
change state may let a blocking call run its handler on the caller's thread
while the actor is idle (``TurnActor``, ``Turns``). This package sits
between the facade and the blueprint packages (patterns, agents, train,
realtime, streams), which build on it and not on each other.
"""

from atomr_accel.blueprint._actor import BlueprintActor
from atomr_accel.blueprint._checks import (
    TIMEOUT,
    require_positive_int,
    require_system,
    require_timeout,
    require_wait,
)
from atomr_accel.blueprint._client import BlueprintClient, SystemLike, spawn_actor
from atomr_accel.blueprint._turns import TurnActor, Turns, TurnTaker
from atomr_accel.blueprint._twin import twin, twins_with_old_name

__all__ = [
    "TIMEOUT",
    "BlueprintActor",
    "BlueprintClient",
    "SystemLike",
    "TurnActor",
    "TurnTaker",
    "Turns",
    "require_positive_int",
    "require_system",
    "require_timeout",
    "require_wait",
    "spawn_actor",
    "twin",
    "twins_with_old_name",
]
