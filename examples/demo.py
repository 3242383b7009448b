"""The main demo: ``atomr-accel demo`` (devices, a gemm/FFT/RNG/solver round checked
against NumPy, a fault injected and recovered, placement, a summary).

    python examples/demo.py        # the same as: atomr-accel demo

``actor_demo.py`` and ``device_demo.py`` beside it walk through the actor
runtime and the device tier step by step.
"""

from atomr_accel.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["demo"]))
