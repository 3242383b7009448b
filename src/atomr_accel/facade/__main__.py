"""``python -m atomr_accel.facade``: write the typed stub of the generated methods."""

import sys

from atomr_accel.facade._stubs import STUB, stub

STUB.write_text(stub())
sys.stdout.write(f"wrote {STUB}\n")
