"""The ``atomr-accel`` command (also ``python -m atomr_accel``): ``probe``, ``demo``, ``bench``,
``dashboard``, ``test``.

``main(argv)`` runs it in-process and returns the exit status. See
``docs/operations.md``.
"""

from atomr_accel.cli._bench import find_benchmarks, run_benchmarks
from atomr_accel.cli._dashboard import attach_dashboard
from atomr_accel.cli._demo import DemoCheckFailed, run_demo
from atomr_accel.cli._main import main
from atomr_accel.cli._probe import print_probe, probe
from atomr_accel.cli._test import find_tests, run_tests

__all__ = [
    "DemoCheckFailed",
    "attach_dashboard",
    "find_benchmarks",
    "find_tests",
    "main",
    "print_probe",
    "probe",
    "run_benchmarks",
    "run_demo",
    "run_tests",
]
