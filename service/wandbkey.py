"""Whether W&B takes the fleet's WANDB_API_KEY, and lets it write runs where a job says, asked at submit.

An online W&B run is opened on the node when training starts, after a node was rented and the model
downloaded: a key W&B refuses (revoked, mistyped, another deployment's) or an entity the key's user may
not write to would fail the run there, with the GPU paid. So a job with an online W&B run is refused at
submit when W&B says so: its GraphQL `viewer` (the same query the wandb client starts with) is empty or a
401 for a key it does not take, and lists the user's own entity and teams otherwise. When W&B cannot be
asked (no answer, a 5xx), nothing proves the key wrong: the job is taken, and the log says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import requests
from pydantic import SecretStr

log = logging.getLogger("trainfleet.service")

VIEWER_TIMEOUT_S = 10.0
VIEWER = "query Viewer { viewer { username entity teams { edges { node { name } } } } }"


@dataclass(frozen=True)
class Refusal:
    """Why W&B will not take the job's runs, and whether it is the entity (else the key) that is wrong."""

    why: str
    entity: bool = False


def wandb_refusal(
    base_url: str, key: SecretStr, entity: str | None, timeout_s: float = VIEWER_TIMEOUT_S
) -> Refusal | None:
    """Why W&B at `base_url` will not take runs written with `key` (under `entity`, when one is named), in
    words; None when it will, or when W&B could not say."""
    try:
        reply = requests.post(
            f"{base_url.rstrip('/')}/graphql",
            json={"query": VIEWER},
            auth=("api", key.get_secret_value()),
            timeout=timeout_s,
        )
    except requests.RequestException as exc:
        log.warning(
            "could not ask W&B at %s whether it takes WANDB_API_KEY (%s)", base_url, type(exc).__name__
        )
        return None
    refused = f"W&B at {base_url} does not accept WANDB_API_KEY"
    if reply.status_code in (401, 403):
        return Refusal(f"{refused} ({reply.status_code}): set a valid API key (wandb.ai/authorize)")
    if reply.status_code != 200:
        log.warning(
            "could not ask W&B at %s whether it takes WANDB_API_KEY (it answered %s)",
            base_url,
            reply.status_code,
        )
        return None
    try:
        viewer = (reply.json().get("data") or {}).get("viewer")
    except (ValueError, AttributeError):
        return None
    if not isinstance(viewer, dict):
        return Refusal(f"{refused} (it knows no user by that key): set a valid API key (wandb.ai/authorize)")
    return _entity_refusal(viewer, entity) if entity else None


def _entity_refusal(viewer: dict[str, Any], entity: str) -> Refusal | None:
    user = str(viewer.get("username") or "")
    own = {user, str(viewer.get("entity") or "")}
    edges = (viewer.get("teams") or {}).get("edges") or []
    teams = sorted(str((e.get("node") or {}).get("name")) for e in edges if isinstance(e, dict))
    if entity in own or entity in teams:
        return None
    whose = f"WANDB_API_KEY is {user}'s" + (f" (teams: {', '.join(teams)})" if teams else " (no teams)")
    return Refusal(f"{whose}: it cannot write runs under the entity {entity}", entity=True)
