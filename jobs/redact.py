"""The job file as it may be shown to others (a model card on the hub): every secret taken out.

Job files refuse credentials (jobs.sections.base), but a value may still carry one under an innocent name
(a URL with a password in an `env:` entry). So what is shown is the parsed job with: every value under an
`env` mapping replaced, every value whose key sounds secret replaced, and any of the fleet's own
credential values that still appear anywhere replaced. Comments do not survive (the YAML is re-dumped).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

REDACTED = "<redacted>"
SECRET_KEY = re.compile(r"token|secret|passw(or)?d|api[_-]?key|credential|auth", re.IGNORECASE)
MIN_SECRET_LEN = 6  # shorter "secrets" would blank out ordinary words


def redact_job(text: str, secret_values: Iterable[str] = ()) -> str:
    """`text` (a job file that already validated) with its secrets replaced by <redacted>."""
    data = yaml.safe_load(text)
    shown = yaml.safe_dump(_redact(data), sort_keys=False, allow_unicode=True, width=100)
    return redact_values(shown, secret_values)


def redact_values(text: str, secret_values: Iterable[str]) -> str:
    """`text` with every one of `secret_values` in it replaced by <redacted> (longest first, so a secret
    that contains another goes whole; values shorter than MIN_SECRET_LEN are left alone)."""
    for secret in sorted({s for s in secret_values if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def _redact(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        if key == "env":
            return {k: REDACTED for k in value}
        return {k: _redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, key) for v in value]
    if SECRET_KEY.search(key) and value is not None:
        return REDACTED
    return value
