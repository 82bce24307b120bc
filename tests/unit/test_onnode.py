"""The node-side programs (providers/onnode/) run on a rented node before the fleet's software is there:
each imports the standard library only, and nothing of ours, since providers.bootstrap ships its source
alone (packed into the start script)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.unit.test_layers import ROOT

ONNODE = ROOT / "providers" / "onnode"


def imports_beyond_stdlib(path: Path) -> list[str]:
    """The top-level names of the modules `path` imports that are not the standard library's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else ["." * node.level + (node.module or "")]
        else:
            continue
        found += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names and n != "__future__"]
    return found


def test_the_node_programs_import_the_standard_library_only() -> None:
    programs = sorted(p for p in ONNODE.glob("*.py") if p.name != "__init__.py")
    assert [p.stem for p in programs] == ["failsafe", "nodesetup", "poolstop", "tlsfront"]
    # poolstop runs in the failsafe's namespace on a pool node: its import of the failsafe, which names what
    # it uses for the fleet's checks, is left out when it is packed (providers.bootstrap.packed).
    ours = {"poolstop.py": ["providers.onnode.failsafe"]}
    assert {p.name: imports_beyond_stdlib(p) for p in programs} == {
        p.name: ours.get(p.name, []) for p in programs
    }


def test_the_check_sees_an_import_of_ours(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("import os\nfrom core.errors import FleetError\nfrom . import sibling\nimport yaml\n")
    assert imports_beyond_stdlib(program) == ["core.errors", ".", "yaml"]
