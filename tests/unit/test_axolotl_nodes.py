"""What an axolotl job's node is: its image, the software its start installs, its readiness check, the
local interpreter, and the fakes' image for it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from core.node_settings import DEFAULT_AXOLOTL_IMAGE, DEFAULT_NODE_IMAGE
from core.settings import Settings
from providers.base import NodeSoftware, ProviderContext
from providers.bootstrap import axolotl_pins, node_pins, node_setup_env
from providers.local.client import AXOLOTL_VENV, axolotl_python, node_python
from providers.onnode import nodesetup
from providers.world import World
from tests.factories import REPO_ROOT
from tests.fakes import node_images
from workers.readiness import entrypoint

AXOLOTL = NodeSoftware("axolotl", "0.19.0")


def test_an_axolotl_node_starts_axolotls_image_unless_its_section_names_one(tmp_path: Path) -> None:
    context = ProviderContext(home=tmp_path)
    assert context.image(None, AXOLOTL) == DEFAULT_AXOLOTL_IMAGE
    assert context.image(None, NodeSoftware()) == DEFAULT_NODE_IMAGE
    assert context.image("me/mine:1", AXOLOTL) == "me/mine:1"
    chosen = World.of(Settings(home=tmp_path, node_image="me/node:2", axolotl_image="me/ax:3")).context
    assert chosen.image(None, NodeSoftware()) == "me/node:2" and chosen.image(None, AXOLOTL) == "me/ax:3"


def test_an_axolotl_node_installs_axolotl_and_the_fleets_ray_and_keeps_its_own_python() -> None:
    ray = next(pin for pin in node_pins() if pin.startswith("ray"))
    assert axolotl_pins("0.19.0") == ("axolotl==0.19.0", ray)
    env = node_setup_env(AXOLOTL)
    assert env[nodesetup.PINS_ENV].split() == ["axolotl==0.19.0", ray]
    assert nodesetup.PYTHON_ENV not in env  # axolotl's image is built for its own Python
    builtin = node_setup_env(NodeSoftware())
    assert builtin[nodesetup.PINS_ENV].split() == list(node_pins())
    assert builtin[nodesetup.PYTHON_ENV] == f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_the_readiness_check_asks_an_axolotl_node_for_axolotl_at_the_runs_release() -> None:
    axolotl = shlex.split(entrypoint(2, AXOLOTL))
    assert "--axolotl=0.19.0" in axolotl and "--gpus=2" in axolotl
    assert not any(arg.startswith("--python") for arg in axolotl)
    builtin = shlex.split(entrypoint(2, NodeSoftware()))
    assert not any(arg.startswith("--axolotl") for arg in builtin)
    assert any(arg.startswith("--python=") for arg in builtin)


def test_local_axolotl_nodes_run_the_axolotl_environment_never_the_fleets(tmp_path: Path) -> None:
    assert axolotl_python(tmp_path / "py") == tmp_path / "py"
    found = axolotl_python()
    assert found in (REPO_ROOT / AXOLOTL_VENV / "bin" / "python", node_python())
    assert found.parent != Path(sys.executable).parent
    assert node_images.image(DEFAULT_AXOLOTL_IMAGE).python == found
    assert node_images.image(None).python == node_python()
