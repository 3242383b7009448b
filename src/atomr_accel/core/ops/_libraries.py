"""Questions about the libraries a context runs (not tied to one library's stream)."""

from __future__ import annotations

from dataclasses import dataclass

from atomr_accel.core._errors import InvalidArgument
from atomr_accel.core._op import Op

__all__ = ["LibraryAvailable"]


@dataclass(frozen=True, slots=True)
class LibraryAvailable(Op):
    """Ask the context whether the library ``name`` (``"cudnn"``, ``"blaslt"``, ...) can run
    there: answers True, or False when a Python package it needs does not import."""

    name: str

    def validate(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"name must be a library name, got {self.name!r}")
