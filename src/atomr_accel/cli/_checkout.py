"""Where the package's own suites live: the checkout this package runs from.

``atomr-accel test`` and ``atomr-accel bench`` run code. They run the package's
own ``tests/`` and ``benchmarks/`` only, never those of the current directory,
which may belong to someone else (a shared ``/tmp``, an unpacked archive,
another project): another folder runs only when the user names it (``--path``).
"""

from __future__ import annotations

from pathlib import Path

import atomr_accel

__all__ = ["candidate_folders", "checkout_folder"]


def checkout_folder(name: str) -> Path | None:
    """The folder ``name`` (``"tests"``, ``"benchmarks"``) of the source checkout this
    package is imported from (``<checkout>/src/atomr_accel``); None for an installed
    wheel (no ``src/`` layout above the package) or when the checkout lacks it."""
    package = Path(atomr_accel.__file__).resolve().parent
    if package.parent.name != "src":
        return None
    folder = package.parents[1] / name
    return folder if folder.is_dir() else None


def candidate_folders(path: str | Path | None, name: str) -> list[Path]:
    """Where to look for the suites: ``[path]`` when the user named one, else the
    checkout's folder ``name`` (``checkout_folder``) if there is one."""
    if path is not None:
        return [Path(path)]
    own = checkout_folder(name)
    return [] if own is None else [own]
