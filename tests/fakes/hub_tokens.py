"""The Hub fake's access tokens: read or write, and where a write token may write.

The Hub has read tokens, write tokens (for the user's own namespace and its organizations') and
fine-grained tokens (write on the namespaces or repos they name). A request that writes with a token that
may not gets 403 and the Hub's reason, in the body and in X-Error-Message, which huggingface_hub shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["read", "write"]


@dataclass(frozen=True)
class TokenScope:
    """One token: its role, and the namespaces it may write to (empty for a read token)."""

    role: Role
    namespaces: frozenset[str]
    fine_grained: bool = False  # named namespaces only (whoami-v2 says role "fineGrained")

    def refusal(self, namespace: str, what: str) -> str | None:
        """Why this token may not `what` (e.g. "create a model", "write to ns/name") in `namespace`."""
        if self.role == "read":
            return f"Forbidden: you must use a write token to {what}. This token is a read token"
        if namespace not in self.namespaces:
            return f'You don\'t have the rights to {what} under the namespace "{namespace}"'
        return None

    def whoami_auth(self, name: str) -> dict[str, Any]:
        """The `auth` part of GET /api/whoami-v2 for this token."""
        if not self.fine_grained:
            return {"type": "access_token", "accessToken": {"displayName": name, "role": self.role}}
        scoped = [
            {"entity": {"type": "user", "name": ns}, "permissions": ["repo.content.read", "repo.write"]}
            for ns in sorted(self.namespaces)
        ]
        grained = {"canReadGatedRepos": True, "global": [], "scoped": scoped}
        return {
            "type": "access_token",
            "accessToken": {"displayName": name, "role": "fineGrained", "fineGrained": grained},
        }
