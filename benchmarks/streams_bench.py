"""Stream pipelines: elements a second through 3 trivial stages (``atomr_accel.streams``).

``--n`` integers (1,000,000) from ``Source.of`` through ``x + 1``, ``x * 2`` and
``x - 1`` (plain functions, parallelism 1) into ``Sink.to_list``; the output is
checked. Goal: >= 50,000 elements/s on the 2-core machine.

    python benchmarks/streams_bench.py [--json PATH] [--n N] [--chunk C]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from _report import add_quick, print_table, write_json

from atomr_accel.streams import Pipeline, Source, stage


async def once(n: int, chunk: int) -> float:
    pipeline = Pipeline(Source.of(range(n)),
                        [stage(lambda x: x + 1), stage(lambda x: x * 2), stage(lambda x: x - 1)],
                        chunk=chunk)
    start = time.perf_counter()
    out = await pipeline.run()
    seconds = time.perf_counter() - start
    assert out == [2 * x + 1 for x in range(n)], "wrong output"
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the results to this path")
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    add_quick(parser, n=20_000, repeat=1)
    args = parser.parse_args()
    rates = [asyncio.run(once(args.n, args.chunk)) for _ in range(args.repeat)]
    best, median = max(rates), statistics.median(rates)
    one = asyncio.run(once(args.n // 10, 1))
    rows = [[f"3 trivial stages, chunk {args.chunk}", median, best,
             "met" if median >= 50_000 else "missed"],
            [f"3 trivial stages, chunk 1 ({args.n // 10} elements)", one, one,
             "met" if one >= 50_000 else "missed"]]
    print_table(f"Pipeline throughput, {args.n} elements (elements/s; goal >= 50,000)",
                ["pipeline", "median", "best", "goal"], rows)
    if args.json:
        write_json(args.json, {"n": args.n, "chunk": args.chunk, "rates": rates,
                               "chunk1_rate": one})


if __name__ == "__main__":
    main()
