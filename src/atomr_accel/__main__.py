"""``python -m atomr_accel``: the ``atomr-accel`` command."""

from atomr_accel.cli import main

raise SystemExit(main())
