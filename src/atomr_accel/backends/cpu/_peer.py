"""Peer access on the CPU backend: there is none.

A CPU "device" is a set of NumPy arrays in one context; no other context can
reach them, so every peer query answers False and nothing can be enabled.
``System.copy_between`` copies between CPU devices through the host instead
(``Download`` then ``Upload``); ``ExportBuffer`` and ``ImportCopy`` have no CPU
implementation.
"""

from __future__ import annotations

from atomr_accel.backends._base import Backend
from atomr_accel.backends._handlers import cpu
from atomr_accel.core.ops._peer import CanAccessPeer, EnablePeerAccess

__all__: list[str] = []


@cpu.handles(CanAccessPeer, EnablePeerAccess)
def _no_access(backend: Backend, op: CanAccessPeer | EnablePeerAccess) -> tuple[bool, ...]:
    return tuple(False for _ in op.peers)
