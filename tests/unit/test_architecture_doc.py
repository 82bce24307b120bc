"""docs/ARCHITECTURE.md names modules that exist: every `package/module.py` in its layout and every dotted
name of ours (`service.runs.submit`, `core.errors`) it mentions resolves to a module (and, where it names
one, an attribute of it)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from state.payloads import EventType
from tests.unit.test_layers import OURS, ROOT

DOC = ROOT / "docs" / "ARCHITECTURE.md"
_DOTTED = re.compile(r"(?<![\w./-])((?:" + "|".join(OURS) + r")(?:\.[A-Za-z_]\w*)+)")
_LAYOUT_ROW = re.compile(r"^  (\S.*?)\s{2,}")  # "  name.py      what it does", in the layout block


def layout_files(text: str) -> list[str]:
    """The files the layout block lists, as paths: `provision.py prepare.py` under `workers/` ->
    workers/provision.py, workers/prepare.py; `local/` rows name a folder."""
    block = text.split("```", 4)[3]  # the second code block: the package tree
    found, package = [], ""
    for line in block.splitlines():
        if re.match(r"^[a-z]+/", line):
            package = line.split()[0]
            continue
        row = _LAYOUT_ROW.match(line + "  ")
        if not row or not package:
            continue
        for name in row.group(1).split():
            if name.endswith((".py", "/")):
                found.append(package + name.rstrip(":"))
            elif name.endswith(".py:"):
                found.append(package + name[:-1])
    return found


def _resolves(dotted: str) -> bool:
    parts = dotted.rstrip(".").split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        if (
            not (ROOT / Path(*parts[:cut])).with_suffix(".py").exists()
            and not (ROOT / Path(*parts[:cut]) / "__init__.py").exists()
        ):
            continue
        target: object = importlib.import_module(module)
        for attr in parts[cut:]:
            if not hasattr(target, attr):
                return False
            target = getattr(target, attr)
        return True
    return False


def test_every_file_in_the_layout_exists() -> None:
    files = layout_files(DOC.read_text(encoding="utf-8"))
    assert len(files) > 60, "the layout block was not found or not read"
    missing = [f for f in files if not (ROOT / f).exists()]
    assert not missing, f"ARCHITECTURE.md lists files that do not exist: {missing}"


def test_every_file_of_ours_is_in_the_layout() -> None:
    listed = set(layout_files(DOC.read_text(encoding="utf-8")))
    folders = {f for f in listed if f.endswith("/")}
    unlisted = []
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if path.name in ("__init__.py", "__main__.py") or rel in listed:
                continue
            if any(rel.startswith(folder) for folder in folders) or "/assets/" in rel:
                continue
            unlisted.append(rel)
    assert not unlisted, f"modules ARCHITECTURE.md's layout does not list: {unlisted}"


def test_every_dotted_name_of_ours_resolves() -> None:
    events = {e.value for e in EventType}  # `bot.command`, `run.queued`: event types, not modules
    names = sorted(set(_DOTTED.findall(DOC.read_text(encoding="utf-8"))) - events)
    assert len(names) > 10
    broken = [name for name in names if not _resolves(name)]
    assert not broken, f"ARCHITECTURE.md names what does not exist: {broken}"
