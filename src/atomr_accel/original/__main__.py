"""``python -m atomr_accel.original``: write the original's top-level modules from ``SHIMS``."""

from pathlib import Path

from atomr_accel.original._shims import write_all

if __name__ == "__main__":
    for path in write_all(Path(__file__).resolve().parent.parent):
        print(f"wrote {path}")
