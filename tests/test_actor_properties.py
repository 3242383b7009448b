"""Property: any interleaving of many senders keeps per-sender order and answers every ask."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from atomr_accel.actor import Actor, ActorSystem, Directive, OneForOneStrategy, Props


class Log(Actor):
    """Logs (sender, seq); raises on messages marked to fail, yields on some."""

    def __init__(self, log: list[tuple[int, int]]) -> None:
        self.log = log

    async def receive(self, message: Any) -> Any:
        sender, seq, fail, pause = message
        if pause:
            await asyncio.sleep(0)
        self.log.append((sender, seq))
        if fail:
            raise ValueError(f"{sender}:{seq}")
        return (sender, seq)


class Sender(Actor):
    """An actor that relays a script of sends to the target (actor-to-actor order)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    async def receive(self, message: Any) -> Any:
        for item in message:
            self.target.tell(item)
        return len(message)


step = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2))
script = st.lists(step, min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(st.lists(script, min_size=2, max_size=6), st.booleans())
def test_per_sender_order_and_every_ask_answered(
    scripts: list[list[tuple[bool, bool, bool, int]]], via_actors: bool
) -> None:
    async def run() -> None:
        log: list[tuple[int, int]] = []
        resume = OneForOneStrategy(decider=lambda exc: Directive.RESUME)
        async with ActorSystem("prop", guardian_strategy=resume) as system:
            target = system.spawn(Props(Log, log), "target")

            async def client(sid: int, steps: list[tuple[bool, bool, bool, int]]) -> int:
                answered = 0
                for seq, (ask, fail, pause, yields) in enumerate(steps):
                    msg = (sid, seq, fail, pause)
                    if ask:
                        try:
                            assert await target.ask(msg, timeout=5) == (sid, seq)
                            assert not fail
                        except ValueError as exc:
                            assert fail and str(exc) == f"{sid}:{seq}"
                        answered += 1
                    else:
                        target.tell(msg)
                    for _ in range(yields):
                        await asyncio.sleep(0)
                return answered

            if via_actors:
                senders = [system.spawn(Props(Sender, target)) for _ in scripts]
                items = [[(sid, seq, f, p) for seq, (_, f, p, _) in enumerate(s)]
                         for sid, s in enumerate(scripts)]
                await asyncio.gather(*(ref.ask(i) for ref, i in zip(senders, items, strict=True)))
            else:
                answered = await asyncio.gather(*(client(i, s) for i, s in enumerate(scripts)))
                assert answered == [sum(1 for st_ in s if st_[0]) for s in scripts]
            await target.ask((-1, 0, False, False))  # everything before it is processed
        for sid, steps in enumerate(scripts):
            assert [seq for s, seq in log if s == sid] == list(range(len(steps)))

    asyncio.run(run())
