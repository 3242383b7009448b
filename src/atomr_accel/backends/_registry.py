"""Which backends there are, what each can do, and their classes, imported on first use.

The layers above ask a backend's ``Capabilities`` (does it need a GPU, where
do its buffers live, may two devices copy peer to peer ...) instead of
comparing its name, and get its class from ``backend_class``: nothing above
``backends/`` imports ``backends.cpu`` or ``backends.cuda``. The capabilities
are declared here, so asking them imports neither backend (nor CuPy).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, cast

from atomr_accel.core._errors import DeviceUnavailable

if TYPE_CHECKING:
    from atomr_accel.backends._base import Backend

__all__ = ["BACKENDS", "Capabilities", "backend_class", "capabilities", "communicator_id"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend offers, by what the layers above ask."""

    needs_gpu: bool
    """A context needs a GPU of its own (visible here, or on its Ray node)."""
    device_memory: bool
    """Buffers live in the GPU's memory: a host array cannot view them without a copy."""
    array_module: str
    """The array module whose arrays view a buffer inside the context (``"numpy"``,
    ``"cupy"``)."""
    peer_access: bool
    """Two devices of this process may copy between them peer to peer."""
    library_streams: bool
    """Each library runs on a stream of its own."""
    completion_strategies: bool
    """The backend takes a ``completion`` strategy (how it learns work has finished)."""
    compiles_kernels: bool
    """The backend compiles kernels at run time (NVRTC)."""
    collectives_across_machines: bool
    """The ranks of a collective world may run on several machines (NCCL's network);
    else they meet in one machine's shared memory."""


BACKENDS: dict[str, Capabilities] = {
    "cpu": Capabilities(needs_gpu=False, device_memory=False, array_module="numpy",
                        peer_access=False, library_streams=False,
                        completion_strategies=False, compiles_kernels=False,
                        collectives_across_machines=False),
    "cuda": Capabilities(needs_gpu=True, device_memory=True, array_module="cupy",
                         peer_access=True, library_streams=True,
                         completion_strategies=True, compiles_kernels=True,
                         collectives_across_machines=True),
}
"""Every backend's name and capabilities; its class is ``<name>.<Name>Backend`` of this
package (``backends.cpu.CpuBackend``)."""


def capabilities(name: str) -> Capabilities:
    """The capabilities of backend ``name`` (``DeviceUnavailable`` for an unknown name);
    imports nothing."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise DeviceUnavailable(f"unknown backend {name!r}; choose "
                                f"{' or '.join(map(repr, BACKENDS))}") from None


def _module(name: str, part: str = "") -> ModuleType:
    capabilities(name)  # an unknown name: DeviceUnavailable
    path = f"atomr_accel.backends.{name}{part}"
    try:
        return importlib.import_module(path)
    except ImportError as exc:
        raise DeviceUnavailable(f"the {name} backend cannot be imported here ({exc}); the CUDA "
                                "backend needs CuPy: pip install 'atomr-accel-py[cuda]'"
                                ) from exc


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name``, imported now (``DeviceUnavailable`` if it is unknown
    or cannot be imported here)."""
    return cast("type[Backend]", getattr(_module(name), f"{name.capitalize()}Backend"))


def communicator_id(name: str) -> bytes:
    """A new id for the communicators of one collective world's epoch on backend ``name``,
    made in this process (the parent of the ranks): NCCL's unique id on CUDA."""
    made: bytes = _module(name, "._collective").unique_id()
    return made
