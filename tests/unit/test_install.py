"""What each install brings: the control plane without torch, the node's software at trainer/node-pins.txt's
exact versions, and the fleet's own environment at those pins."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

from core.node_settings import DEFAULT_AXOLOTL_VERSION
from providers.bootstrap import (
    NODE_PINS,
    canonical,
    node_pins,
    node_requirements,
    pins_from_report,
    requirement_name,
)

REPO = Path(__file__).resolve().parents[2]
TRAINING_ONLY = {"torch", "transformers", "peft", "tokenizers", "safetensors", "accelerate"}


def _requirements(path: Path) -> dict[str, Requirement]:
    lines = [line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return {canonical(req.name): req for req in map(Requirement, filter(None, lines))}


def test_every_node_requirement_has_one_pin_inside_its_range() -> None:
    pins = [Requirement(pin) for pin in node_pins()]
    assert [requirement_name(pin) for pin in node_pins()] == [
        requirement_name(r) for r in node_requirements()
    ]
    for requirement, pin in zip(map(Requirement, node_requirements()), pins, strict=True):
        (spec,) = pin.specifier
        assert spec.operator == "==", pin
        assert requirement.specifier.contains(spec.version), (requirement, pin)
        assert pin.extras == requirement.extras, pin


def test_the_fleets_environment_runs_the_nodes_versions() -> None:
    """`make setup` installs the fleet's .venv with the pins as constraints: the trainer the tests run in this
    process is the one the nodes run."""
    for pin in map(Requirement, node_pins()):
        (spec,) = pin.specifier
        assert metadata.version(pin.name).split("+")[0] == spec.version, pin


def test_the_control_plane_brings_no_training_stack_and_shares_the_nodes_ranges() -> None:
    fleet = _requirements(REPO / "requirements-fleet.txt")
    node = _requirements(REPO / "trainer/requirements-node.txt")
    assert TRAINING_ONLY & set(fleet) == set()
    assert "ray" in fleet
    for name in set(fleet) & set(node):
        assert fleet[name].specifier == node[name].specifier, name


def test_the_installed_package_puts_the_training_stack_behind_the_node_extra() -> None:
    requires = [Requirement(r) for r in metadata.requires("trainfleet") or []]
    base = {canonical(r.name) for r in requires if r.marker is None}
    node = {canonical(r.name) for r in requires if r.marker and r.marker.evaluate({"extra": "node"})}
    assert "celery" in base and "ray" in base
    assert TRAINING_ONLY & base == set()
    assert {"torch", "transformers", "peft"} <= node


def test_pins_are_written_from_pips_report(tmp_path: Path) -> None:
    resolved = {canonical(requirement_name(pin)): pin.split("==")[1] for pin in node_pins()}
    resolved = {**resolved, "torch": "2.99.1+cpu", "pyyaml": "7.0"}
    report = {
        "install": [
            {
                "metadata": {
                    "name": {"pyyaml": "PyYAML", "huggingface-hub": "huggingface_hub"}.get(n, n),
                    "version": v,
                }
            }
            for n, v in resolved.items()
        ]
        + [{"metadata": {"name": "aiohttp", "version": "3.0"}}]
    }
    pins = pins_from_report(report)
    assert pins[0] == "torch==2.99.1"  # the local build's label dropped
    assert "pyyaml==7.0" in pins and "ray[default,train]==" + resolved["ray"] in pins
    assert len(pins) == len(node_requirements())  # the nodes' own requirements only, not what they pull in
    assert NODE_PINS.name == "node-pins.txt"


def test_the_makefile_reads_the_axolotl_release_from_where_it_is_defined() -> None:
    # `make setup` builds .venv-axolotl at the fleet's default release, read from a Python file by sed: a
    # move of the constant once left it reading nothing (`pip install axolotl==`, a failed setup).
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith("AXOLOTL_VERSION ?="))
    source = REPO / line.rsplit(" ", 1)[-1].rstrip(")")
    assert f'DEFAULT_AXOLOTL_VERSION = "{DEFAULT_AXOLOTL_VERSION}"' in source.read_text(encoding="utf-8")
