"""A tour of the actor runtime: asks, a crashing worker restarted by its supervisor,
death watch, and an orderly shutdown.

    python examples/actor_demo.py
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from atomr_accel.actor import (
    Actor,
    ActorSystem,
    AskTimeout,
    Directive,
    OneForOneStrategy,
    Props,
    Terminated,
)


class Scorer(Actor):
    """Scores text; crashes on empty input (a bug supervision contains)."""

    def __init__(self) -> None:
        self.served = 0

    async def receive(self, message: Any) -> Any:
        if message == "stats":
            return self.served
        if not message:
            raise ValueError("cannot score empty text")
        self.served += 1
        return sum(map(ord, message)) % 100


class Service(Actor):
    """Owns the scorer, restarts it on ValueError (at most 3 times a minute)."""

    supervisor_strategy = OneForOneStrategy(
        max_restarts=3, within=60.0,
        decider=lambda exc: Directive.RESTART if isinstance(exc, ValueError) else Directive.STOP,
    )

    def __init__(self) -> None:
        self.scorer = self.context.watch(self.context.spawn(Props(Scorer), "scorer"))

    async def receive(self, message: Any) -> Any:
        if isinstance(message, Terminated):
            print(f"  service saw {message.ref.path} terminate")
            return None
        self.context.forward(self.scorer)  # the scorer's answer goes to the asker
        return None


async def main() -> None:
    logging.basicConfig(level=logging.CRITICAL)  # the demo prints what matters itself
    async with ActorSystem("demo") as system:
        service = system.spawn(Props(Service), "service")
        print("scores:", [await service.ask(text) for text in ("gpu", "actor", "python")])
        try:
            await service.ask("")
        except ValueError as exc:
            print(f"a bad request failed with its own error: {exc!r}")
        print("after the crash the scorer was restarted; served since:",
              await service.ask("stats"))
        print("still serving:", await service.ask("again"))
        try:
            await service.ask("slow", timeout=0.0)
        except AskTimeout as exc:
            print(f"asks never hang: {exc}")
        print(f"dead letters so far: {system.dead_letters}")
    print("system terminated: every actor stopped, children first")


if __name__ == "__main__":
    asyncio.run(main())
