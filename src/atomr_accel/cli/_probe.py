"""``atomr-accel probe``: what this machine offers: backends, GPUs, optional libraries."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from typing import IO, Any

from atomr_accel.cli._table import format_bytes, format_table

__all__ = ["LIBRARIES", "print_probe", "probe"]

LIBRARIES: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    ("cupy", "cupy", ("cupy-cuda13x", "cupy-cuda12x", "cupy")),
    ("nvmath", "nvmath", ("nvmath-python",)),
    ("cudnn", "cudnn", ("nvidia-cudnn-frontend",)),
    ("libcudnn", None, ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")),
    ("cuda.compute", "cuda.compute", ("cuda-cccl",)),
    ("cuda.cccl", "cuda.cccl", ("cuda-cccl",)),
    ("cuda.bindings", "cuda.bindings", ("cuda-bindings",)),
    ("nccl", None, ("nvidia-nccl-cu13", "nvidia-nccl-cu12")),
    ("cutensor", None, ("cutensor-cu13", "cutensor-cu12")),
    ("cupti", "cupti", ("cupti-python",)),
    ("libcupti", None, ("nvidia-cuda-cupti", "nvidia-cuda-cupti-cu13", "nvidia-cuda-cupti-cu12")),
    ("onnxruntime", "onnxruntime", ("onnxruntime-gpu", "onnxruntime")),
    ("pynvml", "pynvml", ("nvidia-ml-py", "pynvml")),
    ("ray", "ray", ("ray",)),
    ("prometheus_client", "prometheus_client", ("prometheus-client",)),
)
"""(name, module to find or None, distributions that may carry it), as ``probe`` reports them:
``cudnn`` is NVIDIA's cuDNN frontend, ``libcudnn`` the library; ``cuda.compute`` and
``cuda.cccl`` are CCCL's Python modules; ``cupti`` is cupti-python, ``libcupti`` the library."""


def _version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False  # its parent package is missing


def _libraries() -> list[dict[str, Any]]:
    rows = []
    for name, module, distributions in LIBRARIES:
        version = _version(distributions)
        found = version is not None if module is None else _found(module)
        rows.append({"name": name, "found": found, "version": version if found else None})
    return rows


def _cuda() -> dict[str, Any]:
    """CUDA through CuPy: whether it is usable, and each device's figures."""
    try:
        import cupy
    except Exception as exc:
        return {"available": False, "reason": f"CuPy is not importable ({exc.__class__.__name__}"
                f": {exc}); pip install 'atomr-accel-py[cuda]' on a GPU machine", "devices": []}
    runtime = cupy.cuda.runtime
    try:
        count = int(runtime.getDeviceCount())
    except Exception as exc:
        return {"available": False, "reason": f"CuPy {cupy.__version__} sees no CUDA device: "
                f"{exc}", "devices": []}
    if count == 0:
        return {"available": False, "reason": f"CuPy {cupy.__version__} sees no CUDA device",
                "devices": []}
    devices = []
    for index in range(count):
        props = runtime.getDeviceProperties(index)
        name = props["name"]
        with cupy.cuda.Device(index):
            free, total = runtime.memGetInfo()
        devices.append({
            "index": index,
            "name": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": f"{props['major']}.{props['minor']}",
            "memory_total": int(total), "memory_free": int(free),
            "multiprocessors": int(props["multiProcessorCount"]),
        })
    driver, cuda_runtime = runtime.driverGetVersion(), runtime.runtimeGetVersion()
    return {"available": True, "reason": None, "devices": devices,
            "driver": driver, "runtime": cuda_runtime,
            "driver_version": _cuda_version(driver), "runtime_version": _cuda_version(cuda_runtime),
            "driver_release": _driver_release(), "cupy": cupy.__version__}


def _cuda_version(number: int) -> str:
    """CUDA's version number as text: ``13000`` -> ``"13.0"``."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _driver_release() -> str | None:
    """The NVIDIA driver's release (``580.82.07``) through NVML, or None without it."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        release = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
    return release.decode() if isinstance(release, bytes) else str(release)


def probe() -> dict[str, Any]:
    """Return what this machine offers, as plain data (what ``--json`` prints).

    Libraries are looked up, not imported (importing Ray takes seconds);
    CuPy is imported to list the GPUs.
    """
    from atomr_accel import __version__

    return {
        "atomr_accel": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "backends": {
            "cpu": {"available": True, "numpy": _version(("numpy",)),
                    "scipy": _version(("scipy",))},
            "cuda": _cuda(),
        },
        "libraries": _libraries(),
    }


def print_probe(report: dict[str, Any], out: IO[str]) -> None:
    """Print ``report`` (from ``probe``) as text."""
    cpu, cuda = report["backends"]["cpu"], report["backends"]["cuda"]
    print(f"atomr-accel {report['atomr_accel']} on Python {report['python']} "
          f"({report['platform']})", file=out)
    print("\nbackends", file=out)
    release = f" ({cuda['driver_release']})" if cuda.get("driver_release") else ""
    cuda_text = (f"available: CuPy {cuda['cupy']}, driver CUDA {cuda['driver_version']}"
                 f"{release}, runtime CUDA {cuda['runtime_version']}" if cuda["available"]
                 else f"not available: {cuda['reason']}")
    print(format_table(["backend", "status"], [
        ["cpu", f"available: NumPy {cpu['numpy']}, SciPy {cpu['scipy']}"],
        ["cuda", cuda_text],
    ]), file=out)
    print("\ndevices", file=out)
    if cuda["devices"]:
        print(format_table(
            ["gpu", "name", "compute capability", "SMs", "memory free", "memory total"],
            [[d["index"], d["name"], d["compute_capability"], d["multiprocessors"],
              format_bytes(d["memory_free"]), format_bytes(d["memory_total"])]
             for d in cuda["devices"]]), file=out)
    else:
        print("  no GPU: devices run on the CPU backend (spawn_device(mock=True)); "
              "memory is the host's (or backend_options={'capacity': n})", file=out)
    print("\nlibraries", file=out)
    print(format_table(["library", "found", "version"], [
        [lib["name"], "yes" if lib["found"] else "no",
         lib["version"] or ("-" if lib["found"] else "missing")]
        for lib in report["libraries"]]), file=out)
