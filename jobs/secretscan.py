"""Secret-looking values anywhere in a job file, refused at validate: credentials never travel in a job.

A job file reaches the ledger, the run's events, the W&B config, the node's Ray jobs and a model card on
the Hub, so a credential written into it (`hub_token: hf_...` in a key trainfleet passes through, a key in
an `env:` value, a private key block in `entry`) would leak to every one of them. `scan` walks every key
and value, nested too, and reports each one that looks like a credential, by its key path and line and
never by its value:

- a value shaped like a known vendor's credential (`PATTERNS`: Hugging Face, RunPod, OpenAI-style,
  GitHub, AWS, Discord bot tokens, private key blocks, W&B local keys), under any key;
- any non-empty value under a key named like a credential (`secret_key`): `*token*`, `*secret*`,
  `*password*`, `*api_key*`...; except the tokenizer's own keys (`pad_token`, `special_tokens`), which
  name text the model reads, not credentials. A bare 40-hex value (a W&B key, but also a git commit
  sha) is caught by this rule only, under such a key.

`looks_secret` and `redacted` serve the fleet's defence in depth: what goes to the node's Ray jobs
(workers.node_job) has such values taken out even if a job got past validation before this check existed.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import Problem
from jobs.problems import line_of
from jobs.sections.base import SECRETS_ADVICE
from jobs.yamlsafe import join_path

REDACTED = "<redacted>"


@dataclass(frozen=True)
class Pattern:
    """One kind of credential recognised by its shape, and the words an error uses for it."""

    what: str
    regex: re.Pattern[str]


def _p(what: str, pattern: str) -> Pattern:
    return Pattern(what, re.compile(pattern))


_B = r"(?<![A-Za-z0-9_-])"  # the credential starts a word: `xhf_...` is not a token
PATTERNS = (
    _p("a Hugging Face token", _B + r"hf_[A-Za-z0-9]{30,}"),
    _p("a Hugging Face organisation token", _B + r"api_org_[A-Za-z0-9]{30,}"),
    _p("a RunPod API key", _B + r"rpa_[A-Za-z0-9]{30,}"),
    _p(
        "an OpenAI-style API key", _B + r"sk-(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])[A-Za-z0-9_-]{32,}"
    ),
    _p("a GitHub token", _B + r"(gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{60,})"),
    _p("an AWS access key id", r"(?<![A-Z0-9])(AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"),
    _p("a Discord bot token", _B + r"[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}"),
    _p("a private key", r"-----BEGIN ([A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----"),
    _p("a W&B API key", _B + r"local-[0-9a-f]{40}(?![0-9a-f])"),
    _p("a Slack token", _B + r"xox[abposr]-[A-Za-z0-9-]{10,}"),
)

# Key names that hold a credential: split into words (snake, kebab, camel case), these words or pairs.
_SECRET_WORDS = frozenset(
    {"secret", "secrets", "password", "passwd", "passphrase", "apikey", "credential", "credentials"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})
_TOKEN_WORDS = frozenset({"token", "pat"})
# Tokenizer keys (transformers', axolotl's): text the model reads, never credentials.
NOT_SECRET_KEYS = frozenset(
    {
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "eot_token",
    }
)
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def secret_key(key: str) -> bool:
    """Whether a key's name says its value is a credential (`hub_token`, `HF_TOKEN`, `apiKey`)."""
    if key.lower() in NOT_SECRET_KEYS:
        return False
    words = [w.lower() for w in _WORD.findall(key)]
    if _SECRET_WORDS.intersection(words) or _TOKEN_WORDS.intersection(words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def looks_secret(value: str) -> str | None:
    """What `value` looks like (`a Hugging Face token`) when it holds a known kind of credential, or None."""
    for pattern in PATTERNS:
        if pattern.regex.search(value):
            return pattern.what
    return None


def scan(data: Any, lines: Mapping[str, int], prefix: str = "") -> list[Problem]:
    """Every secret-looking value (and key) in `data`, nested mappings and lists too: one problem each,
    with its YAML key path and line; the value itself is never in the message."""
    problems: list[Problem] = []
    _walk(data, prefix, False, lines, problems)
    return problems


def _walk(value: Any, path: str, under_secret: bool, lines: Mapping[str, int], out: list[Problem]) -> None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = join_path(path, str(key))
            what = looks_secret(str(key))
            if what is not None:
                out.append(
                    Problem(where, f"the key looks like {what}: {SECRETS_ADVICE}", line_of(lines, where))
                )
                continue
            _walk(item, where, under_secret or secret_key(str(key)), lines, out)
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _walk(item, join_path(path, i), under_secret, lines, out)
        return
    if value is None or isinstance(value, bool):
        return  # `hf_use_auth_token: true` says to use a token, it holds none
    text = str(value)
    what = looks_secret(text)
    if what is not None:
        message = f"the value looks like an access token ({what}): {SECRETS_ADVICE}"
    elif under_secret and text.strip():
        message = f"the key names a secret, and a value is set: {SECRETS_ADVICE}"
    else:
        return
    out.append(Problem(path, message, line_of(lines, path)))


def said_once(found: list[Problem], problems: list[Problem]) -> list[Problem]:
    """`problems` without those of another check on a key `scan` already `found` secret-looking (one that
    refuses the value too, perhaps echoing it), so each is said once, without the value."""
    paths = {p.path for p in found}
    mine = {id(p) for p in found}
    return [p for p in problems if id(p) in mine or p.path not in paths]


def redacted(value: Any, under_secret: bool = False) -> Any:
    """`value` (JSON-like data) with every secret-looking value, and every value under a key that names a
    secret, replaced by REDACTED. What the node's Ray jobs get, whatever a job's file held."""
    if isinstance(value, Mapping):
        return {k: redacted(v, under_secret or secret_key(str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, under_secret) for v in value]
    if isinstance(value, str) and (looks_secret(value) is not None or (under_secret and value.strip())):
        return REDACTED
    return value
