"""How the process host starts its worker and reads the frames the worker writes.

``WORKER_COMMAND`` and ``worker_env`` say how a worker process starts and what it
imports; ``read_frame`` reads one length-prefixed pickled frame from its stdout.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import atomr_accel
from atomr_accel.hosts._wire import HEADER

__all__ = ["WORKER_COMMAND", "import_dirs", "read_frame", "worker_env"]

_PACKAGE_ROOT = str(Path(atomr_accel.__file__).resolve().parents[1])  # the worker imports from it
WORKER_COMMAND = (sys.executable, "-P", "-s", str(Path(__file__).with_name("_boot.py")),
                  "atomr_accel.hosts._worker")
"""How a worker starts: ``-P`` keeps the caller's current directory off its ``sys.path``
(a ``numpy.py`` there must not run in the worker), ``-s`` the user's site-packages;
``_boot.py``, run by its path, imports only what the worker needs."""


def worker_env(environ: Mapping[str, str], dirs: Sequence[str] = ()) -> dict[str, str]:
    """The worker's environment: the caller's, with this package's root first on
    ``PYTHONPATH``, then the caller's ``PYTHONPATH`` and ``dirs``, and no empty
    entry there (an empty entry would mean the current directory)."""
    paths = [_PACKAGE_ROOT, *environ.get("PYTHONPATH", "").split(os.pathsep), *dirs]
    return {**environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def import_dirs() -> list[str]:
    """This process's import directories (``sys.path``), so that a device function's module
    that pickles by reference (a module next to the caller's script) imports in the worker."""
    own = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})  # the interpreter finds these
    return [p for p in sys.path if p and not p.startswith(own) and os.path.isdir(p)]


async def read_frame(stream: asyncio.StreamReader) -> Any:
    """The next frame the worker wrote, unpickled; None once its stdout has closed."""
    try:
        header = await stream.readexactly(HEADER)
        body = await stream.readexactly(int.from_bytes(header, "little"))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return pickle.loads(body)
