"""The original package's forms, in one place.

atomr-accel keeps code written for the original ``atomr-accel`` Python package
(release 0.10, built with PyO3) running: its import paths, its names, its
argument orders and defaults. The rest of the package speaks its own
vocabulary; what exists only for the original is declared here:

- ``_shims``: the original's module names (``atomr_accel.blas``,
  ``atomr_accel.system``, ``atomr_accel._native``, ...), declared once in
  ``SHIMS``; ``python -m atomr_accel.original`` writes the thin top-level
  modules from it. ``DEVICE_NAMES``: the original's ``atomr_accel.device``
  names (``Device``, ``DeviceLoad``, ``GpuBuffer*``), which
  ``atomr_accel.device`` looks up here on first use.
- ``_op_forms``: loads every ``_<library>_forms`` module, which attaches the
  original's forms of that library's ops (its argument orders and aliases,
  generated into handle methods); ``_options`` holds the original's option
  strings and their parsers.
- ``_forms``: ``own_form``, ``is_models`` and ``attach_spawn``, which give a
  blueprint class's ``spawn`` the original's signature beside its own.
- ``_patterns`` and ``_pattern_models``: the serving patterns' original
  handles and demo models; ``_graph``: the agents' original graph names;
  ``_train``: the trainers' original ``spawn`` forms and demo models.

``docs/original-api.md`` maps the original's names to the package's own. No
module of the package imports these but the blueprint packages' ``__init__``,
which re-export the original names they always offered.
"""

from atomr_accel.original._shims import DEVICE_NAMES, SHIMS, Shim

__all__ = ["DEVICE_NAMES", "SHIMS", "Shim"]

from atomr_accel._public import publish as _publish  # a lazily imported package

_publish(__name__)  # its names report this module (see atomr_accel._public)
