"""Container image references: which registry an image is pulled from, as docker decides it.

A private image (`private_image: true` in a section) is pulled with the fleet's login for its registry
(RunPod: a container registry auth on the account, `runpod_registry_auths`; vast.ai: a docker login,
VAST_REGISTRY_LOGINS), found by the registry this module names. docker's own rule (distribution's
reference normalisation): the part before the first `/` is a registry when it has a `.` or a `:` or is
`localhost` (or has capitals); otherwise the image is Docker Hub's (`docker.io`), as is a name with no `/`.
"""

from __future__ import annotations

import re

DOCKER_HUB = "docker.io"
_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})
SERVER = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$")
"""A registry's name: a host, with a port or not (`ghcr.io`, `registry.example.com:5000`)."""


def registry_of(image: str) -> str:
    """The registry `image` is pulled from (`ghcr.io/acme/trainer:1` -> ghcr.io, `axolotlai/axolotl`
    -> docker.io), Docker Hub by its one name."""
    first, slash, _ = image.partition("/")
    is_host = slash and (any(c in first for c in ".:") or first == "localhost" or first != first.lower())
    return server_name(first) if is_host else DOCKER_HUB


def server_name(server: str) -> str:
    """A registry's name as the fleet keys its logins: lower case, Docker Hub's aliases as docker.io."""
    lowered = server.strip().lower()
    return DOCKER_HUB if lowered in _HUB_ALIASES else lowered
