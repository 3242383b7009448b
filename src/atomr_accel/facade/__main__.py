"""``python -m atomr_accel.facade``: write what is generated from the catalogue as source
files (the typed stub of the generated methods, the handle classes' imports)."""

import sys

from atomr_accel.facade._stubs import HANDLES, STUB, handles, stub

for path, text in ((STUB, stub()), (HANDLES, handles())):
    path.write_text(text)
    sys.stdout.write(f"wrote {path}\n")
