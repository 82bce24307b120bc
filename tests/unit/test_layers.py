"""The house's layers, read from the code: each package imports only the packages below it.

The order is written once, here. `trainer/` runs on the node, so it imports nothing of ours; the fleet's
packages may import its protocol modules (the job's config, the progress lines) from jobs/ upwards.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A package may import those before it, never those after.
LAYERS = ("core", "jobs", "state", "broker", "providers", "workers", "service", "bot", "fleet")
NODE = "trainer"  # beside the layers: imports none of ours, importable from jobs/ up
OURS = (*LAYERS, NODE)


@dataclass(frozen=True)
class CrossImport:
    """One import of another package of ours: where it is and what it names."""

    path: str
    line: int
    source: str
    target: str
    module: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} -> {self.module}"


def _imported_modules(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def cross_imports(root: Path = ROOT) -> list[CrossImport]:
    """Every import, anywhere in a module (functions and TYPE_CHECKING blocks too), of another package of
    ours."""
    found = []
    for package in OURS:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                for module in _imported_modules(node):
                    target = module.split(".")[0]
                    if target in OURS and target != package:
                        rel = str(path.relative_to(root))
                        found.append(CrossImport(rel, getattr(node, "lineno", 0), package, target, module))
    return found


def _allowed(source: str, target: str) -> bool:
    """Whether package `source` may import package `target`."""
    if source == NODE:
        return False  # the node's code travels alone
    if target == NODE:
        return source != "core"  # the ground floor imports nothing of ours
    return LAYERS.index(target) < LAYERS.index(source)


def violations(imports: list[CrossImport]) -> list[CrossImport]:
    """The imports that run upwards, out of the node's package, or from the ground floor into it."""
    return [imp for imp in imports if not _allowed(imp.source, imp.target)]


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the package graph, as the packages along it, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_every_package_imports_only_the_layers_below_it() -> None:
    imports = cross_imports()
    assert len(imports) > 50, "the scan found too few imports to be reading the code"
    bad = violations(imports)
    assert not bad, "imports that run upwards:\n" + "\n".join(map(str, bad))


def test_the_packages_form_no_cycle() -> None:
    edges: dict[str, set[str]] = {}
    for imp in cross_imports():
        edges.setdefault(imp.source, set()).add(imp.target)
    assert _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    """The scan itself: a planted upward import (inside a function) is reported with its place, and a
    two-package loop is a cycle."""
    for package in OURS:
        (tmp_path / package).mkdir()
    (tmp_path / "core" / "bad.py").write_text("def f():\n    from fleet.cli import main\n")
    (tmp_path / "trainer" / "bad.py").write_text("import state.models\n")
    (tmp_path / "jobs" / "fine.py").write_text("from core.errors import FleetError\nimport trainer.config\n")
    found = violations(cross_imports(tmp_path))
    assert [str(v) for v in found] == [
        "core/bad.py:2: core -> fleet.cli",
        "trainer/bad.py:1: trainer -> state.models",
    ]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def print_imports() -> None:
    """`python -m tests.unit.test_layers`: every cross-package import, counted by pair of packages."""
    counts: dict[tuple[str, str], int] = {}
    for imp in cross_imports():
        counts[(imp.source, imp.target)] = counts.get((imp.source, imp.target), 0) + 1
    for (source, target), n in sorted(counts.items(), key=lambda kv: (OURS.index(kv[0][0]), kv[0][1])):
        print(f"{source:>10} -> {target:<10} {n}")


if __name__ == "__main__":
    print_imports()
