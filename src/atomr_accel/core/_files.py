"""Read the ``.npz`` files the package writes (indexes, checkpoints), as typed errors.

A file cut short, an empty file, a ``.npy`` where an ``.npz`` belongs or a
damaged member makes NumPy raise ``BadZipFile``, ``EOFError``, ``TypeError``
or ``zlib.error``; a caller that guards a restore with ``except
InvalidArgument`` must see one class whatever the damage, and an actor that
loads a file must not crash (and restart empty) on it. So every load goes
through ``read_npz``, which reads the whole archive before answering.
"""

from __future__ import annotations

import os
import zipfile
import zlib
from typing import Any

import numpy as np

from atomr_accel.core._errors import InvalidArgument

__all__ = ["read_npz"]

_DAMAGED = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)
"""What NumPy raises for a missing, unreadable or damaged archive (or a damaged member)."""


def read_npz(path: str | os.PathLike[str], what: str) -> dict[str, np.ndarray[Any, Any]]:
    """Every array of the ``.npz`` archive at ``path``, by name; pickled objects refused.

    ``what`` names the content in the message (``"a vector index"``). A path
    that is not a str or PathLike, a missing or unreadable file, a file that is
    not an ``.npz`` archive (a ``.npy`` array included) or a damaged archive
    raises ``InvalidArgument`` naming the path; nothing else escapes.
    """
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"path must be a str or a PathLike, got {type(path).__name__}")
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            loaded = np.load(file, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise InvalidArgument(f"cannot read {what} from {name!r}: "
                                      "not an .npz archive")
            with loaded as archive:
                return {key: archive[key] for key in archive.files}
    except _DAMAGED as exc:
        raise InvalidArgument(f"cannot read {what} from {name!r}: "
                              f"{type(exc).__name__}: {exc}") from exc
