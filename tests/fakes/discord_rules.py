"""What Discord refuses in a message, and in an interaction's answer, for the Discord fake.

Messages (create, webhook execute, edits, an interaction's message callback): content up to 2,000
characters; up to 10 embeds; in an embed a title up to 256, a description up to 4,096, up to 25 fields (a
name up to 256, a value up to 1,024), a footer up to 2,048 and an author name up to 256; and all the embeds
of a message together up to 6,000 characters of titles, descriptions, field names and values, footers and
author names. Over a limit Discord answers 400 "Invalid Form Body" (code 50035) naming the field, and posts
nothing. An interaction is answered once (a second callback: 400 code 40060), and within 3 seconds of its
creation (later: 404 Unknown interaction, code 10062); its followups may come for 15 minutes.
"""

from __future__ import annotations

from typing import Any

CONTENT_MAX = 2000
EMBEDS_MAX = 10
EMBED_TOTAL_MAX = 6000
FIELDS_MAX = 25
TEXT_MAX = {"title": 256, "description": 4096}
FIELD_MAX = {"name": 256, "value": 1024}
FOOTER_MAX = 2048
AUTHOR_MAX = 256
INTERACTION_ANSWER_S = 3.0
MESSAGE_OPERATIONS = frozenset(
    {"create_message", "execute_webhook", "edit_message", "edit_webhook_message", "interaction_callback"}
)


def form_error(data: dict[str, Any]) -> dict[str, Any] | None:
    """Discord's 400 body for a message's JSON payload that breaks a limit (its `errors` name the field,
    e.g. `embeds.0.title`); None when Discord takes it. An interaction callback's message is its `data`."""
    problem = message_problem(data)
    if problem is None:
        return None
    path, message = problem.split(": ", 1)
    errors: dict[str, Any] = {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": message}]}
    for part in reversed(path.split(".")):
        errors = {part: errors}
    return {"message": "Invalid Form Body", "code": 50035, "errors": errors}


def message_problem(data: dict[str, Any]) -> str | None:
    """The first limit a message's JSON payload breaks, as `path: why`; None when Discord takes it."""
    content = data.get("content")
    if isinstance(content, str) and len(content) > CONTENT_MAX:
        return f"content: Must be {CONTENT_MAX} or fewer in length."
    embeds = data.get("embeds") or []
    if not isinstance(embeds, list):
        return None
    if len(embeds) > EMBEDS_MAX:
        return f"embeds: Must be {EMBEDS_MAX} or fewer in length."
    total = 0
    for i, embed in enumerate(e for e in embeds if isinstance(e, dict)):
        problem, size = _embed_problem(embed, f"embeds.{i}")
        if problem is not None:
            return problem
        total += size
    if total > EMBED_TOTAL_MAX:
        return f"embeds: Embed size exceeds maximum size of {EMBED_TOTAL_MAX}"  # (code MAX_EMBED_SIZE)
    return None


def _embed_problem(embed: dict[str, Any], at: str) -> tuple[str | None, int]:
    size = 0
    for key, limit in TEXT_MAX.items():
        text = str(embed.get(key) or "")
        if len(text) > limit:
            return f"{at}.{key}: Must be {limit} or fewer in length.", 0
        size += len(text)
    fields = embed.get("fields") or []
    if len(fields) > FIELDS_MAX:
        return f"{at}.fields: Must be {FIELDS_MAX} or fewer in length.", 0
    for j, field in enumerate(fields):
        for key, limit in FIELD_MAX.items():
            text = str(field.get(key) or "")
            if len(text) > limit:
                return f"{at}.fields.{j}.{key}: Must be {limit} or fewer in length.", 0
            size += len(text)
    for key, limit in (("footer", FOOTER_MAX), ("author", AUTHOR_MAX)):
        part = embed.get(key) or {}
        text = str(part.get("text" if key == "footer" else "name") or "") if isinstance(part, dict) else ""
        if len(text) > limit:
            return f"{at}.{key}: Must be {limit} or fewer in length.", 0
        size += len(text)
    return None, size
