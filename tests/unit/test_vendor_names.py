"""A cloud's knowledge lives in its own package (providers/<cloud>/) and reaches the rest of the fleet
through the registry: no code outside them names a vendor. Code means identifiers and string literals;
comments and docstrings may name one as an example. A file that still does, for a reason, is listed in
`STILL_NAMING` with the reason, and the list is exact: a file that stops naming one must leave it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from providers.registry import PROVIDERS
from providers.remote import RemoteProvider

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "jobs", "state", "broker", "providers", "workers", "service", "bot", "fleet", "trainer")

# The words that name each rented cloud in code (its name, its display name, its variables' prefix).
VENDOR_WORDS = {"runpod": ("runpod",), "vastai": ("vast",)}
WORDS = re.compile("|".join(w for words in VENDOR_WORDS.values() for w in words), re.IGNORECASE)

STILL_NAMING = {
    "jobs/secretscan.py": "the shapes of known credentials (RunPod's among Hugging Face's, GitHub's, "
    "AWS's...), refused in any job file whatever clouds this fleet has",
    "providers/onnode/failsafe.py": "the node's failsafe, standard library only and shipped whole: each "
    "cloud's give-back call (the instance's own key) is one of its functions",
}


def _docstrings(tree: ast.Module) -> set[int]:
    """The lines where a docstring (a module's, class's, function's or attribute's) starts."""
    return {
        node.value.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def naming(path: Path) -> list[str]:
    """The identifiers and string literals (not docstrings, not comments) of `path` that name a vendor."""
    source = path.read_text(encoding="utf-8")
    docs = _docstrings(ast.parse(source))
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        code = tok.type == tokenize.NAME or (tok.type == tokenize.STRING and tok.start[0] not in docs)
        if code and WORDS.search(tok.string):
            found.append(f"{tok.start[0]}: {tok.string[:60]}")
    return found


def outside_the_clouds() -> dict[str, list[str]]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == "providers/registry.py" or any(rel.startswith(f"providers/{c}/") for c in VENDOR_WORDS):
                continue
            if hits := naming(path):
                found[rel] = hits
    return found


def test_every_rented_cloud_s_words_are_known_to_this_test() -> None:
    rented = {name.value for name, cls in PROVIDERS.items() if issubclass(cls, RemoteProvider)}
    assert rented == set(VENDOR_WORDS)


def test_no_code_outside_a_cloud_s_package_and_the_registry_names_a_vendor() -> None:
    found = outside_the_clouds()
    unlisted = {path: hits for path, hits in found.items() if path not in STILL_NAMING}
    assert unlisted == {}, (
        "a vendor's name outside its package: declare it there, reach it through the registry"
    )
    assert sorted(STILL_NAMING) == sorted(found), "a file that names no vendor any more: take it off the list"


def test_the_scan_finds_a_vendor_in_code_and_not_in_docs(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Docs may say RunPod."""\n\n# and vast.ai in a comment\n'
        'def f() -> str:\n    """RunPod again."""\n    return "vast.ai"\n\n\nRUNPOD_KEY = 1\n'
    )
    assert naming(sample) == ['6: "vast.ai"', "9: RUNPOD_KEY"]
