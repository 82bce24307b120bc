"""Every key the fleet accepts is read by something, or refused: a table over the fields of every provider
section, the builtin recipe's config and the TrainJob the node gets.

A field counts as read when the fleet's or the trainer's code (not the tests, not the benches) takes its
value by name somewhere: `x.field` (not as a method call), `x["field"]`, `x.get("field")` or
`getattr(x, "field")`. A field that nothing reads is accepted and then ignored, which a job file must never
be; a field the fleet cannot honour yet is refused (REFUSED), and the refusal is checked by validating it.
What each key does is shown by its own tests (test_switches, test_prepared, test_spec, ...); this table
makes sure no new key slips in without a reader.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from jobs.sections import section_models
from jobs.sections.head import HeadShape
from providers.runpod.section import NetworkVolumeAsk
from tests.factories import REPO_ROOT
from trainer.config import TrainConfig, TrainJob

CODE = ("bot", "broker", "core", "fleet", "jobs", "providers", "service", "state", "trainer", "workers")
REFUSED: dict[tuple[str, str], object] = {
    ("runpod", "axolotl_root"): "/content/axolotl",
}
"""(model, field) -> a value: accepted by its type, refused because the fleet cannot honour it yet."""


def models() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {name.value: model for name, model in section_models().items()}
    volume = {"network_volume": NetworkVolumeAsk}
    return {**found, "head": HeadShape, **volume, "builtin": TrainConfig, "TrainJob": TrainJob}


def fields() -> list[tuple[str, str]]:
    return [(name, field) for name, model in models().items() for field in model.model_fields]


@cache
def read_by_name() -> frozenset[str]:
    """Every name the fleet's and the trainer's code reads a value by (the module's notes)."""
    names: set[str] = set()
    for package in CODE:
        for path in (REPO_ROOT / package).rglob("*.py"):
            names |= _reads(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return frozenset(names)


def _reads(tree: ast.AST) -> set[str]:
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and id(node) not in called:
            names.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            names.add(str(node.slice.value))
        elif isinstance(node, ast.Call):
            func = node.func
            named = isinstance(func, ast.Name) and func.id in ("getattr", "hasattr")
            by_getattr = named and len(node.args) > 1
            by_get = isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and node.args
            given = node.args[1] if by_getattr else node.args[0] if by_get else None
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                names.add(given.value)
    return names


@pytest.mark.parametrize(("model", "field"), fields(), ids=[f"{m}.{f}" for m, f in fields()])
def test_every_accepted_key_has_a_reader(model: str, field: str) -> None:
    if (model, field) in REFUSED:
        return  # test_a_refused_key_is_refused shows it never passes
    assert field in read_by_name(), (
        f"{model}.{field} is accepted and nothing reads it: implement it, or refuse it (REFUSED)"
    )


@pytest.mark.parametrize(("model", "field"), list(REFUSED), ids=[f"{m}.{f}" for m, f in REFUSED])
def test_a_refused_key_is_refused(model: str, field: str) -> None:
    with pytest.raises(ValidationError, match="is not supported yet"):
        models()[model].model_validate({field: REFUSED[model, field]})


def test_the_reader_check_sees_a_key_nothing_reads() -> None:
    """The check itself: a name only declared, or only called as a method, is not read."""
    code = "class A:\n    lonely: int = 1\n\nlog.lonelier('x')\nx = obj.read_one\ny = d['read_two']\n"
    tree = ast.parse(code)
    assert _reads(tree) == {"read_one", "read_two"}
    assert "prepare_ds_only" in read_by_name() and "never_declared_anywhere" not in read_by_name()


def test_the_table_covers_the_models() -> None:
    assert {m for m, _ in REFUSED} <= set(models())
    assert all(f in models()[m].model_fields for m, f in REFUSED)
    assert len(fields()) > 100  # every section, the builtin's config and the TrainJob


def test_the_code_dirs_are_the_packages() -> None:
    packages = {p.parent.name for p in REPO_ROOT.glob("*/__init__.py")}
    assert set(CODE) == packages - {"tests", "bench"}, "a new package: add it to CODE"
    assert all(Path(REPO_ROOT / p).is_dir() for p in CODE)
