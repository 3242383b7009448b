"""The method sets of the handles, generated from the ops' declarations (``Op.api``).

One set per catalogued library whose ops declare forms (``BlasApi`` for
``"blas"``, named by the library's title), and ``DeviceApi`` for the methods of
``Device``. ``_api.pyi`` holds their typed stub: run ``python -m
atomr_accel.facade`` after changing a declaration (a test says when it is out
of date).
"""

from __future__ import annotations

import types

from atomr_accel.core._catalogue import LibraryInfo, catalogue
from atomr_accel.facade._generate import Generated, declared_ops


class DeviceApi(Generated, handle="device"):
    """The methods of ``Device`` declared by ops (``free``, ``copy``, ``sgemm``, ...)."""


def _method_set(info: LibraryInfo) -> type[Generated]:
    """The method set of one library's handle (``BlasApi``)."""
    def body(namespace: dict[str, object]) -> None:
        namespace["__module__"] = __name__
        namespace["__doc__"] = f"The methods of the ``{info.name}`` handle: {info.summary}"

    return types.new_class(f"{info.title}Api", (Generated,), {"handle": info.name}, body)


_HANDLES = {form.handle or op.library for op in declared_ops() for form in op.api}

API_SETS: dict[str, type[Generated]] = {
    info.name: _method_set(info) for info in catalogue() if info.name in _HANDLES
}
"""Library name -> its method set; ``"device"`` -> ``DeviceApi``."""
API_SETS["device"] = DeviceApi
globals().update({cls.__name__: cls for cls in API_SETS.values()})

__all__: list[str] = ["API_SETS"]
__all__.extend(sorted(cls.__name__ for cls in API_SETS.values()))
