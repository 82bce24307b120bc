"""The fleet's settings about the nodes it starts: their images and Pythons, the SSH key they get, and the
fault injection of drills (how a cloud's nodes are reached is that cloud's: providers/<cloud>/settings.py).
core.settings.Settings holds these too (it derives from NodeSettings): one flat settings file and
`FLEET_<NAME>` variables, as for every other knob.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from core.sshkey import SshPublicKey, parse_ssh_public_key

# A rented node's image when neither its section nor the settings name one: Ray's, at the fleet's Ray and
# Python, with CUDA; its start installs the rest of the node's software (providers.onnode.nodesetup).
DEFAULT_NODE_IMAGE = "rayproject/ray:2.60.0-py311-gpu"
# axolotl jobs: the axolotl release their nodes train with, and its official image (axolotl's own CI tags a
# release `<version>-py<python>-cu<cuda>-<torch>`); the node's start adds Ray where the image lacks it.
DEFAULT_AXOLOTL_VERSION = "0.19.0"
DEFAULT_AXOLOTL_IMAGE = "axolotlai/axolotl:0.19.0-py3.12-cu130-2.12.0"


class NodeSettings(BaseModel):
    """The node side of the fleet's settings (see the module's notes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_image: str = Field(
        DEFAULT_NODE_IMAGE,
        description="The image of a rented node whose section names none: point it at the node image you "
        "published (`make node-image`); a stock image works too, its start installs what it lacks.",
    )
    axolotl_version: str = Field(
        DEFAULT_AXOLOTL_VERSION,
        pattern=r"^[0-9][0-9A-Za-z.+-]*$",
        description="The axolotl release an axolotl job trains with when it names none (`axolotl_version:`).",
    )
    axolotl_image: str = Field(
        DEFAULT_AXOLOTL_IMAGE,
        description="The image of a rented node for an axolotl job whose section names none.",
    )
    axolotl_python: Path | None = Field(
        None,
        description="The Python of the local nodes that run axolotl jobs (`make axolotl-env`); unset: "
        ".venv-axolotl beside the fleet's venv.",
    )
    node_python: Path | None = Field(
        None,
        description="The Python of the local nodes' own environment (the node's software only, `make "
        "node-env`); unset: .venv-node beside the fleet's venv if there is one, else the fleet's own Python.",
    )
    ssh_public_key: SshPublicKey | None = Field(
        None,
        description="An OpenSSH public key line, or the path of a .pub file: installed on every rented node "
        "(`fleet ssh RUN`); unset: nodes get no SSH.",
    )
    fault_injection: str | None = Field(
        None,
        description="Drills and tests only: trainer.faults' FLEET_INJECT items (e.g. nan_at_step:30) for "
        "the trainer of every run this fleet starts. A job file cannot set FLEET_INJECT; never set this on "
        "a fleet that trains for real.",
    )

    @field_validator("ssh_public_key", mode="before")
    @classmethod
    def _ssh_key(cls, value: Any) -> Any:
        """The key's text or a .pub file's path, checked as an OpenSSH public key line; empty: none."""
        if isinstance(value, str | Path):
            return parse_ssh_public_key(value) if str(value).strip() else None
        return value
