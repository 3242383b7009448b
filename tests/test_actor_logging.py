"""An actor's failures go to the ``atomr_accel.actor`` logger, never to stderr on their own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from atomr_accel.actor import Actor, ActorSystem, Directive, OneForOneStrategy, Props

pytestmark = pytest.mark.anyio

_SRC = str(Path(__file__).resolve().parents[1] / "src")


class Failing(Actor):
    """Raises the exceptions it is sent; answers anything else."""

    async def receive(self, message: Any) -> Any:
        if isinstance(message, BaseException):
            raise message
        return message


class Parent(Actor):
    """Supervises one ``Failing`` child: restart on KeyError, stop on anything else."""

    supervisor_strategy = OneForOneStrategy(
        decider=lambda exc: Directive.RESTART if isinstance(exc, KeyError) else Directive.STOP)

    def __init__(self) -> None:
        self.child = self.context.spawn(Props(Failing), "child")

    async def receive(self, message: Any) -> Any:
        return await self.child.ask(message)


async def test_a_restart_is_info_and_a_stop_is_an_error_both_with_the_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="atomr_accel.actor")
    async with ActorSystem("logging") as system:
        parent = system.spawn(Props(Parent), "parent")
        with pytest.raises(KeyError):
            await parent.ask(KeyError("restart me"))
        assert await parent.ask("again") == "again"
        with pytest.raises(PermissionError):
            await parent.ask(PermissionError("stop me"))
    failures = [r for r in caplog.records
                if r.name == "atomr_accel.actor" and "supervisor decided" in r.getMessage()]
    levels = {r.getMessage().rsplit(" ", 1)[-1]: r.levelno for r in failures}
    assert levels == {"RESTART": logging.INFO, "STOP": logging.ERROR}
    assert all(r.exc_info is not None and r.exc_info[0] is not None for r in failures)


def test_an_unconfigured_interpreter_prints_nothing_when_an_actor_restarts_or_stops() -> None:
    script = textwrap.dedent("""
        import asyncio
        from atomr_accel.actor import Actor, ActorSystem, Props

        class Failing(Actor):
            async def receive(self, message):
                raise RuntimeError("boom")

        async def main():
            async with ActorSystem("bare") as system:
                ref = system.spawn(Props(Failing), "failing")
                for _ in range(5):  # restarts, then the budget stops it
                    try:
                        await ref.ask("x", timeout=2)
                    except Exception:
                        pass
            print("done")

        asyncio.run(main())
    """)
    env = {**os.environ, "PYTHONPATH": _SRC}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert done.stderr == ""
