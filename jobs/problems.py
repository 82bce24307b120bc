"""Pydantic's validation errors as the job file's problems: each with the YAML key path and its line.

`validate_mapping` validates one mapping of the file (the training config, a provider section, a sweep
section) against its model and appends every error to a list of `Problem`s: the key path as written in the
YAML ("runpod.gpu_count", "datasets[0].type"), a message for people (bounds, close spellings, the section an
unknown key belongs in) and the line, found with `line_of`. Errors on one path are merged into one problem.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from core.errors import Problem
from jobs.sections import section_models
from jobs.sections.base import CHECK_SCRIPTS
from jobs.yamlsafe import join_path
from trainer.config import HUB_ID_PATTERN, HUB_REPO_PATTERN

_PARENT = re.compile(r"(\.[^.\[\]]*|\[\d+\])$")


def line_of(lines: Mapping[str, int], path: str) -> int | None:
    """The line of `path`, or of its nearest parent that is in the file (a missing key's mapping)."""
    while path in lines or _PARENT.search(path):
        if path in lines:
            return lines[path]
        path = _PARENT.sub("", path)
    return None


def validate_mapping(
    model: type[BaseModel], data: Any, prefix: str, lines: Mapping[str, int], problems: list[Problem]
) -> Any:
    """`model.model_validate(data)`, or None with the errors appended to `problems` as YAML key paths.
    The file's scripts (a section's `entry`) are checked with the shell here (base.CHECK_SCRIPTS)."""
    if not isinstance(data, dict):
        message = "must be a mapping of keys (or empty, for all defaults)"
        problems.append(Problem(prefix, message, line_of(lines, prefix)))
        return None
    try:
        return model.model_validate(data, context={CHECK_SCRIPTS: True})
    except ValidationError as exc:
        problems += _problems_from(exc.errors(), model, data, prefix, lines)
        return None


def _problems_from(
    errors: list[ErrorDetails], model: type[BaseModel], data: Any, prefix: str, lines: Mapping[str, int]
) -> list[Problem]:
    # Errors on one path (the members of a union such as `str | list[str]`) become one problem.
    merged: dict[str, tuple[list[str], str]] = {}
    for err in errors:
        path = _yaml_path(err, data, prefix)
        messages, got = merged.setdefault(path, ([], _got(err, prefix)))
        message = _message(err, model, prefix)
        if message not in messages:
            messages.append(message)
    problems = []
    for path, (messages, got) in merged.items():
        if len(messages) > 1 and all(m.startswith("must be ") for m in messages):
            text = "must be " + " or ".join(m.removeprefix("must be ") for m in messages)
        else:
            text = "; ".join(messages)
        problems.append(Problem(path, text + got, line_of(lines, path)))
    return problems


def _yaml_path(err: ErrorDetails, data: Any, prefix: str) -> str:
    """Pydantic's location as the key path in the file, dropping its markers (union members, '[key]')."""
    path, node = prefix, data
    loc = err["loc"]
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            path, node = join_path(path, part), node[part]
        elif i == len(loc) - 1 and err["type"] == "missing":
            path = join_path(path, part)
    return path


_TYPE_MESSAGES = {
    "missing": "required key is missing",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping of keys",
    "model_type": "must be a mapping of keys",
    "model_attributes_type": "must be a mapping of keys",
}
_BOUND_TYPES = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}
_BOUND_WORDS = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}


def _message(err: ErrorDetails, model: type[BaseModel], prefix: str) -> str:
    kind, ctx, loc = err["type"], err.get("ctx") or {}, err["loc"]
    if kind in _TYPE_MESSAGES:
        return _TYPE_MESSAGES[kind]
    if kind == "extra_forbidden":
        return _unknown_key(str(loc[-1]), model, prefix)
    if kind in _BOUND_TYPES:
        field = model.model_fields.get(str(loc[0])) if len(loc) == 1 else None
        return _bounds(field.metadata if field is not None else [], ctx)
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected')}"
    if kind == "string_too_short":
        return f"must have at least {ctx.get('min_length')} character(s)"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    if kind == "string_pattern_mismatch":
        if ctx.get("pattern") == HUB_ID_PATTERN:
            return "must be a hub repo id like 'org/name'"
        if ctx.get("pattern") == HUB_REPO_PATTERN:
            return "must be a hub repo id like 'org/name' (or 'name' in your own namespace)"
        return f"must match the pattern {ctx.get('pattern')}"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    msg = err["msg"]
    return msg[:1].lower() + msg[1:]


def _bounds(metadata: list[Any], ctx: Mapping[str, Any]) -> str:
    """'must be between 1 and 16' from the field's bounds; the error's own bound if the field is unknown."""
    limits = dict(ctx)
    for item in metadata:
        limits.update({op: getattr(item, op) for op in _BOUND_WORDS if getattr(item, op, None) is not None})
    if "ge" in limits and "le" in limits:
        return f"must be between {limits['ge']} and {limits['le']}"
    parts = [f"{words} {limits[op]}" for op, words in _BOUND_WORDS.items() if op in limits]
    return "must be " + " and ".join(parts)


def _unknown_key(key: str, model: type[BaseModel], prefix: str) -> str:
    text = f"unknown key {key!r}"
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    if close:
        return f"{text} (did you mean {close[0]!r}?)"
    owners = [name.value for name, m in section_models().items() if key in m.model_fields and name != prefix]
    if owners:
        return f"{text} (it belongs in a {' or '.join(owners)} section, not {prefix})"
    return text


def _got(err: ErrorDetails, prefix: str) -> str:
    """' (got 0)' for a short scalar input; nothing for env values, which may be secrets, or a script."""
    value = err.get("input")
    if err["type"] in ("missing", "extra_forbidden") or (prefix and err["loc"][:1] in (("env",), ("entry",))):
        return ""
    if isinstance(value, str):
        return f" (got {json.dumps(shorten(value))})"
    return f" (got {json.dumps(value)})" if value is None or isinstance(value, bool | int | float) else ""


def shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
