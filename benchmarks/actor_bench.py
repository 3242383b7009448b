"""Actor runtime overhead: ask round trip and tell throughput, side by side in one run.

Rows: this runtime (default ask time-out, and ``timeout=None``), a raw asyncio
queue + future baseline, and Pykka's threading actor; with ``--uvloop`` the
asyncio rows run again on uvloop. Goals (2-core CPU): ask p50 <= 10 us, <= 1.5x
the raw baseline, >= 3x faster than Pykka; tell >= 500k messages/s.

    python benchmarks/actor_bench.py [--asks 20000] [--tells 500000] [--uvloop]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _report import add_quick, print_table, summarize_us, write_json

from atomr_accel.actor import Actor, ActorSystem, Props


class Echo(Actor):
    async def receive(self, message: Any) -> Any:
        return message


class Sink(Actor):
    def __init__(self) -> None:
        self.count = 0

    async def receive(self, message: Any) -> Any:
        if message is None:
            return self.count
        self.count += 1
        return None


async def time_asks(ask: Callable[[int], Awaitable[Any]], n: int) -> list[int]:
    for i in range(min(2000, n)):  # warm-up
        await ask(i)
    samples = []
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for i in range(n):
            t0 = clock()
            await ask(i)
            samples.append(clock() - t0)
    finally:
        gc.enable()
    return samples


async def runtime_rows(asks: int, tells: int) -> dict[str, Any]:
    async with ActorSystem("bench") as system:
        echo = system.spawn(Props(Echo))
        default = await time_asks(echo.ask, asks)
        no_timeout = await time_asks(lambda m: echo.ask(m, timeout=None), asks)
        sink = system.spawn(Props(Sink))
        await sink.ask(None)
        t0 = time.perf_counter()
        for i in range(tells):
            sink.tell(i)
        assert await sink.ask(None, timeout=None) == tells
        tell_rate = tells / (time.perf_counter() - t0)
    return {"atomr ask": summarize_us(default), "atomr ask (timeout=None)":
            summarize_us(no_timeout), "atomr tell_per_s": tell_rate}


async def raw_rows(asks: int, tells: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, asyncio.Future[Any] | None]] = asyncio.Queue()
    count = 0

    async def consumer() -> None:
        nonlocal count
        while True:
            message, fut = await queue.get()
            if fut is None:
                count += 1
            else:
                fut.set_result(message if message is not None else count)

    task = asyncio.create_task(consumer())

    async def ask(message: Any) -> Any:
        fut = loop.create_future()
        queue.put_nowait((message, fut))
        return await fut

    samples = await time_asks(ask, asks)
    t0 = time.perf_counter()
    for i in range(tells):
        queue.put_nowait((i, None))
    assert await ask(None) == tells
    rate = tells / (time.perf_counter() - t0)
    task.cancel()
    return {"raw asyncio ask": summarize_us(samples), "raw asyncio tell_per_s": rate}


def pykka_rows(asks: int, tells: int) -> dict[str, Any]:
    try:
        import pykka
    except ImportError:
        return {}

    class PEcho(pykka.ThreadingActor):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def on_receive(self, message: Any) -> Any:
            if message == "count":
                return self.count
            if message == "tell":
                self.count += 1
                return None
            return message

    ref = PEcho.start()
    try:
        for i in range(min(1000, asks)):
            ref.ask(i)
        samples = []
        for i in range(asks):
            t0 = time.perf_counter_ns()
            ref.ask(i)
            samples.append(time.perf_counter_ns() - t0)
        n = min(tells, 100_000)
        t0 = time.perf_counter()
        for _ in range(n):
            ref.tell("tell")
        assert ref.ask("count") == n
        rate = n / (time.perf_counter() - t0)
    finally:
        ref.stop()
    return {"pykka ask": summarize_us(samples), "pykka tell_per_s": rate}


def run_loop(coro_fn: Callable[[], Awaitable[dict[str, Any]]], use_uvloop: bool) -> dict[str, Any]:
    if use_uvloop:
        import uvloop

        return uvloop.run(coro_fn())  # type: ignore[no-any-return]
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=20_000)
    parser.add_argument("--tells", type=int, default=500_000)
    parser.add_argument("--uvloop", action="store_true", help="also run the asyncio rows on uvloop")
    parser.add_argument("--out", default="benchmarks/results/actor_bench.json")
    add_quick(parser, asks=500, tells=5_000)
    args = parser.parse_args()

    results: dict[str, Any] = {}
    loops = [("asyncio", False)] + ([("uvloop", True)] if args.uvloop else [])
    for loop_name, use_uv in loops:
        for fn in (runtime_rows, raw_rows):
            rows = run_loop(lambda fn=fn: fn(args.asks, args.tells), use_uv)
            results.update({f"{k} [{loop_name}]": v for k, v in rows.items()})
    results.update(pykka_rows(args.asks, args.tells))

    base = results["raw asyncio ask [asyncio]"]["p50_us"]
    pykka = results.get("pykka ask", {}).get("p50_us")
    rows = []
    for name, value in results.items():
        if isinstance(value, dict):
            rows.append([name, value["p50_us"], value["p99_us"], value["p50_us"] / base,
                         "" if pykka is None else f"{pykka / value['p50_us']:.1f}x"])
    print_table("ask round trip (us); ratios against raw asyncio and Pykka p50",
                ["row", "p50", "p99", "vs raw", "pykka/row"], rows)
    tell_rows = [[k.replace(" tell_per_s", ""), f"{v:,.0f}"] for k, v in results.items()
                 if (k.endswith("]") and "tell_per_s" in k) or k == "pykka tell_per_s"]
    print_table("tell throughput (messages/s)", ["row", "msg/s"], tell_rows)
    if pykka is None:
        print("\nno Pykka rows: pykka is not installed (pip install -e '.[bench]')")
    write_json(args.out, {"benchmark": "actor_bench", "asks": args.asks, "tells": args.tells,
                          "results": results})


if __name__ == "__main__":
    main()
