"""Whether the fleet's HF token may push where a job says (`hub_model_id`), asked of the Hub at submit.

A push is the last step of a run, after the GPU hours are paid: a read token, or a write token for another
user's namespace, would fail it there. So a job that pushes is refused at submit when the Hub says the
token cannot write to the repo's namespace (GET /api/whoami-v2: the token's role, its user and orgs, and
a fine-grained token's scopes). When the Hub cannot be asked (no answer, a 5xx), nothing proves the token
wrong: the job is taken, the log says so, and a push that then fails carries the Hub's own message.
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from pydantic import SecretStr

log = logging.getLogger("trainfleet.service")

WHOAMI_TIMEOUT_S = 10.0
WRITE_PERMISSIONS = ("repo.write",)


def push_refusal(
    endpoint: str, token: SecretStr, repo_id: str, timeout_s: float = WHOAMI_TIMEOUT_S
) -> str | None:
    """Why `token` cannot push to `repo_id` (`namespace/name`), in words; None when it can, or when the
    Hub could not say."""
    url = f"{endpoint.rstrip('/')}/api/whoami-v2"
    try:
        reply = requests.get(
            url, headers={"Authorization": f"Bearer {token.get_secret_value()}"}, timeout=timeout_s
        )
    except requests.RequestException as exc:
        log.warning("could not ask the Hub whether HF_TOKEN may push to %s (%s)", repo_id, type(exc).__name__)
        return None
    if reply.status_code == 401:
        return f"the Hub does not accept HF_TOKEN ({_hub_message(reply) or '401'}): set a valid write token"
    if reply.status_code != 200:
        log.warning(
            "could not ask the Hub whether HF_TOKEN may push to %s (it answered %s)",
            repo_id,
            reply.status_code,
        )
        return None
    try:
        who = reply.json()
    except ValueError:
        return None
    return _refusal(who, repo_id) if isinstance(who, dict) else None


def _refusal(who: dict[str, Any], repo_id: str) -> str | None:
    namespace = repo_id.split("/")[0]
    user = str(who.get("name") or "")
    orgs = [str(o.get("name")) for o in who.get("orgs") or [] if isinstance(o, dict)]
    auth = who.get("auth")
    access = (auth.get("accessToken") or {}) if isinstance(auth, dict) else {}
    role = access.get("role")
    owner = f"HF_TOKEN is {user}'s" + (f" (orgs: {', '.join(orgs)})" if orgs else "")
    if role == "read":
        return f"HF_TOKEN is a read token; pushing to {repo_id} needs a write token"
    if role == "fineGrained":
        if _scoped_write(access.get("fineGrained") or {}, namespace, repo_id):
            return None
        return (
            f"{owner}, a fine-grained token without write access to {namespace}: it cannot push to {repo_id}"
        )
    if role == "write" and namespace not in (user, *orgs):
        return f"{owner}: it cannot create or write {repo_id} under the namespace {namespace}"
    return None


def _scoped_write(grained: dict[str, Any], namespace: str, repo_id: str) -> bool:
    """Whether a fine-grained token's scopes let it write in `namespace` (or to `repo_id` itself)."""
    for scope in grained.get("scoped") or []:
        if not isinstance(scope, dict):
            continue
        entity = scope.get("entity") or {}
        allowed = any(p in WRITE_PERMISSIONS for p in scope.get("permissions") or [])
        if allowed and entity.get("name") in (namespace, repo_id):
            return True
    return False


def _hub_message(reply: requests.Response) -> str:
    """The Hub's reason: X-Error-Message, else the JSON body's `error`."""
    if reply.headers.get("X-Error-Message"):
        return reply.headers["X-Error-Message"]
    try:
        body = reply.json()
    except ValueError:
        return ""
    return str(body.get("error") or "") if isinstance(body, dict) else ""
