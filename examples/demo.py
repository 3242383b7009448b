"""The main demo: what atomr-accel does, end to end, on this machine.

    python examples/demo.py
"""

from __future__ import annotations

import asyncio

from actor_demo import main as actor_demo
from device_demo import main as device_demo


def main() -> None:
    """Run each part of the demo in turn."""
    print("== actor runtime ==")
    asyncio.run(actor_demo())
    print("\n== device tier (CPU backend; the same code runs on CUDA) ==")
    device_demo()


if __name__ == "__main__":
    main()
