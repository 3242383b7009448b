"""The ``atomr-accel`` command (also ``python -m atomr_accel``): ``probe``, ``demo``, ``bench``,
``dashboard``, ``test``.

``main(argv)`` runs it in-process and returns the exit status. See
``docs/operations.md``.
"""

from atomr_accel.cli._bench import (
    SKIP_STATUS,
    PlannedBenchmark,
    find_benchmarks,
    plan_benchmarks,
    run_benchmarks,
)
from atomr_accel.cli._dashboard import attach_dashboard
from atomr_accel.cli._demo import DemoCheckFailed, run_demo
from atomr_accel.cli._main import main
from atomr_accel.cli._probe import print_probe, probe
from atomr_accel.cli._test import find_tests, run_tests

__all__ = [
    "SKIP_STATUS",
    "DemoCheckFailed",
    "PlannedBenchmark",
    "attach_dashboard",
    "find_benchmarks",
    "find_tests",
    "main",
    "plan_benchmarks",
    "print_probe",
    "probe",
    "run_benchmarks",
    "run_demo",
    "run_tests",
]

from atomr_accel._public import publish as _publish  # a lazily imported package

_publish(__name__)  # its names report this module (see atomr_accel._public)
