"""Helpers of the tests that kill or watch worker processes."""

from __future__ import annotations


def process_gone(pid: int) -> bool:
    """True once ``pid`` has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" in status.read()
    except FileNotFoundError:
        return True
