"""The layers only point down (ARCHITECTURE.md): cli -> search -> targets | store -> space | profile ->
the bottom (errors, environment, measurement, trial, stats, units). Imports are read with `ast` from the
source — every import counts, also those inside functions (a lazy import that hides a cycle is still
a cycle); only `if TYPE_CHECKING:` blocks are left out, since they never run.

Rules:
- a module imports only from its own layer or below; siblings (targets <-> store, space <-> profile)
  never import each other;
- `kernels/dsv4` never imports autoopt; only `autoopt.targets.builtin` and the `measure` command import
  dsv4 (benchmarks may, they are not part of the package);
- no import cycle between modules anywhere in autoopt or dsv4.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"autoopt": REPO / "autoopt", "dsv4": REPO / "kernels" / "dsv4"}

LAYERS = {  # first package component under autoopt -> rank (higher may import lower)
    "": 0, "errors": 0, "environment": 0, "measurement": 0, "trial": 0, "stats": 0, "units": 0,
    "space": 1, "profile": 1,
    "targets": 2, "store": 2,
    "search": 3,
    "cli": 4,
}
SIBLINGS = {frozenset({"targets", "store"}), frozenset({"space", "profile"})}
DSV4_IMPORTERS = ("autoopt.targets.builtin", "autoopt.cli.measure_cmd")


def module_name(path: Path) -> str:
    for top, root in ROOTS.items():
        if path.is_relative_to(root):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    raise ValueError(path)


def source_files() -> list[Path]:
    files = []
    for root in ROOTS.values():
        files += [p for p in root.rglob("*.py") if "migrations" not in p.parts]
    return sorted(files)


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (`from a.b import c` counts as a.b.c when that is a module)."""
    this = module_name(path)
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                pkg = this.split(".")[: len(this.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(pkg + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {m for m in found if m.split(".")[0] in ROOTS}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = source_files()
    known = {module_name(p) for p in files}
    return {module_name(p): {m for m in imported_modules(p, known) if m in known} for p in files}


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_layers_point_down(graph):
    bad = []
    for mod, deps in graph.items():
        if not mod.startswith("autoopt"):
            continue
        for dep in deps:
            if not dep.startswith("autoopt") or dep == "autoopt":
                continue
            a, b = layer_of(mod), layer_of(dep)
            if a == b:
                continue
            if LAYERS[b] > LAYERS[a] or frozenset({a, b}) in SIBLINGS:
                bad.append(f"{mod} ({a}) imports {dep} ({b})")
    assert not bad, "imports that point up or sideways:\n" + "\n".join(sorted(bad))


def test_every_module_has_a_layer(graph):
    unknown = sorted({layer_of(m) for m in graph if m.startswith("autoopt")} - set(LAYERS))
    assert not unknown, f"top-level names with no layer in LAYERS: {unknown}"


def test_dsv4_is_imported_only_by_the_builtin_target(graph):
    bad = sorted(f"{mod} imports {dep}" for mod, deps in graph.items() for dep in deps
                 if dep.startswith("dsv4") and mod.startswith("autoopt") and not mod.startswith(DSV4_IMPORTERS))
    assert not bad, "\n".join(bad)


def test_dsv4_never_imports_autoopt(graph):
    bad = sorted(f"{mod} imports {dep}" for mod, deps in graph.items() for dep in deps
                 if mod.startswith("dsv4") and dep.startswith("autoopt"))
    assert not bad, "\n".join(bad)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of module imports (a package's __init__ importing its own submodules is not one)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def edges(mod: str) -> set[str]:
        # `import a.b.c` runs a/__init__ and a/b/__init__ first; a package importing its children
        # and a child importing its package's names are the normal shape, not a cycle.
        return {d for d in graph.get(mod, ()) if d != mod and not d.startswith(mod + ".")
                and not mod.startswith(d + ".")}

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        stack.append(mod)
        for dep in sorted(edges(mod)):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[mod] = 2
        return None

    for mod in sorted(graph):
        if mod not in state and (cycle := visit(mod)):
            return cycle
    return None


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """The rules above must be able to fail: a made-up graph with a cycle and an upward import."""
    assert find_cycle({"autoopt.a": {"autoopt.b"}, "autoopt.b": {"autoopt.a"}}) == \
        ["autoopt.a", "autoopt.b", "autoopt.a"]
    assert find_cycle({"autoopt.a": {"autoopt.b"}, "autoopt.b": set()}) is None
    assert LAYERS[layer_of("autoopt.cli.app")] > LAYERS[layer_of("autoopt.store.store")]


def test_dsv4_spells_the_restart_classes_as_autoopt_does():
    """dsv4 may not import autoopt, so it keeps its own tuple of restart classes: the two must be one
    vocabulary, in one order (the order is the cost rank)."""
    from dsv4.knobs import RESTART_CLASSES as DSV4_CLASSES

    from autoopt.trial import RESTART_CLASSES

    assert DSV4_CLASSES == RESTART_CLASSES
