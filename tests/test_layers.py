"""The package's layers (docs/architecture.md), checked on every module's imports.

Arrows point down only: a module imports its own layer or the layers below it,
never one above. Where ``blueprint/`` holds the blueprints' base, the blueprint
packages build on it, not on each other (else they may use each other); a
blueprint package's ``__init__.py`` may re-export the original package's names
from ``original/``, above it. Above ``backends/``
no module imports ``backends.cpu`` or ``backends.cuda``: it asks the
``backends`` package for a backend's capabilities and class. ``telemetry`` and
``cli`` sit beside the stack: the facade and the blueprints may use telemetry,
nothing in the stack uses ``cli``. Imports made only for type checking and
imports inside functions count like any other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import atomr_accel

ROOT = Path(atomr_accel.__file__).parent

LAYERS = ("actor", "core", "backends", "hosts", "device", "facade", "blueprint", "blueprints",
          "original")
"""The layers, bottom to top."""
BLUEPRINTS = frozenset({"patterns", "train", "agents", "realtime", "streams"})
BLUEPRINTS_APART = (ROOT / "blueprint").is_dir()
"""Whether the blueprint packages may not import each other (they share ``blueprint/``)."""
BESIDE = {"telemetry": "facade", "cli": None}
"""The packages beside the stack, and the lowest layer that may import each (None: no
layer)."""
CONCRETE_BACKENDS = ("atomr_accel.backends.cpu", "atomr_accel.backends.cuda")
PUBLISHER = "atomr_accel._public"
"""The root's helper that sets public names' ``__module__``: it imports nothing of the
stack, and a package imported on demand (``streams``, ``original``) calls it itself."""

ALLOWED = frozenset({
    # The original package's ``atomr_accel.device.Device`` and ``GpuBuffer*``: looked up
    # in ``original`` on first use, by ``device/__init__.py``'s module ``__getattr__``.
    ("atomr_accel.device", "atomr_accel.original._shims"),
})
"""Known violations, (importer, imported): this list only shrinks."""


def _package(name: str) -> str:
    """The top package of module ``name`` below ``atomr_accel`` ("" for the root)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(name: str) -> str | None:
    package = _package(name)
    if package in BLUEPRINTS:
        return "blueprints"
    return package if package in LAYERS else None


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every ``atomr_accel`` module that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                yield ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.module


def _violation(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported``, or None."""
    if not imported.startswith("atomr_accel.") or _package(imported) == _package(importer):
        return None
    below, above = _layer(imported), _layer(importer)
    if above == below == "blueprints":
        return "imports another blueprint package" if BLUEPRINTS_APART else None
    if above == "blueprints" and below == "original" and importer.count(".") == 1:
        return None  # a blueprint package's __init__.py re-exports the original's names
    if above is None:  # the root's modules, telemetry and cli may import anything
        return None
    if imported == PUBLISHER:  # a package loaded on demand publishes its own names
        return None
    if above != "backends" and imported.startswith(CONCRETE_BACKENDS):
        return "reaches a concrete backend"
    if _package(imported) in BESIDE:
        lowest = BESIDE[_package(imported)]
        if lowest is None or LAYERS.index(above) < LAYERS.index(lowest):
            return f"imports {_package(imported)}, beside the stack"
        return None
    if below is None:
        return "imports a module of the package's root"
    if LAYERS.index(below) > LAYERS.index(above):
        return f"runs up from {above} to {below}"
    return None


def _violations() -> dict[tuple[str, str], str]:
    found: dict[tuple[str, str], str] = {}
    for name, path in _modules():
        for imported in _imports(name, path):
            why = _violation(name, imported)
            if why is not None:
                found[(name, _top(imported))] = why
    return found


def _top(imported: str) -> str:
    """``imported`` cut to what the allow-list names: a concrete backend's package, else
    the module itself."""
    for backend in CONCRETE_BACKENDS:
        if imported.startswith(backend):
            return backend
    return imported


def test_no_import_runs_against_the_layers() -> None:
    found = _violations()
    new = {pair: why for pair, why in found.items() if pair not in ALLOWED}
    assert not new, "\n".join(f"{a} -> {b}: {why}" for (a, b), why in sorted(new.items()))


def test_the_allow_list_holds_only_live_violations() -> None:
    stale = ALLOWED - set(_violations())
    assert not stale, f"fixed, so remove them from ALLOWED: {sorted(stale)}"


def test_the_checker_sees_each_kind_of_violation() -> None:
    assert _violation("atomr_accel.facade._x", "atomr_accel.backends.cuda._backend")
    assert _violation("atomr_accel.hosts._x", "atomr_accel.backends.cpu")
    assert _violation("atomr_accel.core._x", "atomr_accel.device._state")
    assert _violation("atomr_accel.device._x", "atomr_accel.telemetry")
    assert _violation("atomr_accel.facade._x", "atomr_accel.cli")
    assert _violation("atomr_accel.device._x", "atomr_accel.errors")
    assert _violation("atomr_accel.backends.cpu._x", "atomr_accel.backends.cuda") is None
    assert (_violation("atomr_accel.train._x", "atomr_accel.agents") is None) \
        == (not BLUEPRINTS_APART)
    assert _violation("atomr_accel.train", "atomr_accel.original._train") is None
    assert _violation("atomr_accel.train._x", "atomr_accel.original._train")
    assert _violation("atomr_accel.facade._x", "atomr_accel.backends") is None
    assert _violation("atomr_accel.agents._x", "atomr_accel.telemetry") is None
    assert _violation("atomr_accel.cli._x", "atomr_accel.facade._system") is None
