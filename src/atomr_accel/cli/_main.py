"""The ``atomr-accel`` command line: argument parsing and dispatch."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from atomr_accel.cli._bench import run_benchmarks
from atomr_accel.cli._dashboard import attach_dashboard
from atomr_accel.cli._demo import DemoCheckFailed, run_demo
from atomr_accel.cli._probe import print_probe, probe
from atomr_accel.cli._test import run_tests
from atomr_accel.core._errors import GpuRuntimeError
from atomr_accel.telemetry import configure_logging

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atomr-accel", description="An actor-shaped face for GPU compute.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the package's structured log records (INFO) on stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    probe_cmd = commands.add_parser(
        "probe", help="backends, GPUs, compute capability, memory and optional libraries")
    probe_cmd.add_argument("--json", action="store_true", help="print the report as JSON")
    demo_cmd = commands.add_parser(
        "demo", help="the main job on the best backend, checked against NumPy")
    demo_cmd.add_argument("--backend", choices=["auto", "cpu", "cuda"], default="auto",
                          help="auto: CUDA when a GPU is visible, else CPU")
    bench_cmd = commands.add_parser(
        "bench", help="run the scripts in benchmarks/ and print their tables")
    bench_cmd.add_argument("names", nargs="*", help="run only scripts whose name contains one")
    bench_cmd.add_argument("--quick", action="store_true",
                           help="small sizes, few iterations: pass --quick to each script")
    bench_cmd.add_argument("--path", help="the benchmarks folder (default: the package's own, "
                                          "beside its source tree; never ./benchmarks)")
    bench_cmd.add_argument("--json", metavar="PATH", dest="json_path",
                           help="write one JSON report of every benchmark to PATH "
                                "(default: atomr-bench.json here, with --quick)")
    bench_cmd.add_argument("--list", action="store_true", dest="dry_run",
                           help="print the plan (each script and its arguments) and exit")
    dashboard_cmd = commands.add_parser(
        "dashboard", help="attach to a running system's dashboard: where to open it, its devices")
    dashboard_cmd.add_argument("--url", required=True,
                               help="the system's telemetry endpoint, e.g. http://127.0.0.1:9400 "
                                    "(see system.serve_dashboard)")
    dashboard_cmd.add_argument("--token", default=os.environ.get("ATOMR_DASHBOARD_TOKEN"),
                               help="the endpoint's token, when it was served with one "
                                    "(default: $ATOMR_DASHBOARD_TOKEN)")
    test_cmd = commands.add_parser(
        "test", help="run the package's own test suites (pytest), skipping what is missing")
    test_cmd.add_argument("suites", nargs="*", metavar="SUITE",
                          help="run only test files whose name contains one")
    test_cmd.add_argument("--gpu", action="store_true",
                          help="run the GPU tests (marked gpu) instead of the CPU ones")
    test_cmd.add_argument("--smoke", action="store_true",
                          help="run the smoke suite shipped in the package")
    test_cmd.add_argument("--path", help="the tests folder (default: the package's own, beside "
                                         "its source tree, else the smoke suite; never "
                                         "./tests)")
    test_cmd.add_argument("-k", dest="keyword", help="pytest's -k expression")
    test_cmd.add_argument("-x", dest="exit_first", action="store_true",
                          help="stop at the first failure")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``atomr-accel`` with ``argv`` (default: the process's arguments); return the
    exit status: 0 on success, 1 when a check or benchmark failed, 2 on a usage error;
    ``test`` returns pytest's."""
    parser = _parser()
    args = parser.parse_args(argv)
    out = sys.stdout
    if args.command is None:
        parser.print_help(out)
        return 2
    logger = logging.getLogger("atomr_accel")
    level = logger.level
    handler = configure_logging(logging.INFO) if args.verbose else None
    try:
        if args.command == "probe":
            report = probe()
            if args.json:
                print(json.dumps(report, indent=2), file=out)
            else:
                print_probe(report, out)
            return 0
        if args.command == "demo":
            try:
                return run_demo(out, args.backend)
            except (DemoCheckFailed, GpuRuntimeError) as exc:
                print(f"\ndemo failed: {exc!r}", file=out)
                return 1
        if args.command == "dashboard":
            return attach_dashboard(out, args.url, token=args.token)
        if args.command == "test":
            return run_tests(out, args.suites, gpu=args.gpu, smoke=args.smoke, path=args.path,
                             keyword=args.keyword, exit_first=args.exit_first)
        json_path = args.json_path
        if json_path is None and args.quick and not args.dry_run:
            json_path = "atomr-bench.json"
        return run_benchmarks(out, args.names, quick=args.quick, path=args.path,
                              json_path=json_path, dry_run=args.dry_run)
    finally:
        if handler is not None:
            logger.removeHandler(handler)
            logger.setLevel(level)
