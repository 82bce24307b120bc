"""Chat examples tokenized with a chat template, trained on the chosen turns only; and input_output ones.

The template is the tokenizer's own (`chat_template: tokenizer_default`, the default), chatml, or the
job's Jinja (`chat_template_jinja`: the text, or a file's path). A conversation is rendered to text once
and tokenized with character offsets (a fast tokenizer's `offset_mapping`); the characters to train are
found by rendering again: for turn i, the turns before it plus turn i with its content replaced by a
marker string. Where the marker lands is where turn i's content starts in the full text (checked against
it), and what the template writes right after the marker, up to the next turn, is the turn's end marker
(`<|im_end|>`, `</s>`, `<|eot_id|>`: its EOS/EOT, trained as `train_on_eos` says). A token is trained
when its characters overlap a trained span. So no template's syntax is parsed here, and a template that
rewrites content it renders (beyond trimming it) is an error naming the row, never a silent mislabel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import DatasetError
from trainer.formats import Conversation, Segments, Turn

if TYPE_CHECKING:
    from trainer.formats import ChatKeys

IGNORE_INDEX = -100  # as trainer.data's
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_MARK = "\u2063TRAINFLEET-TURN\u2063"  # stands in for a turn's content (invisible separators around it)


def resolve_template(keys: ChatKeys, tokenizer: Any, base_dir: Path | None = None) -> str:
    """The Jinja text of the job's chat template. Raises DatasetError when there is none to use."""
    name = keys.chat_template or ("jinja" if keys.chat_template_jinja else "tokenizer_default")
    if name == "chatml":
        return CHATML
    if name == "jinja" and keys.chat_template_jinja:
        return _jinja_text(keys.chat_template_jinja, base_dir)
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default")
    if isinstance(own, str) and own:
        return own
    if name == "tokenizer_default_fallback_chatml":
        return CHATML
    raise DatasetError(
        "chat data: the tokenizer has no chat template of its own (chat_template: tokenizer_default); "
        "set `chat_template: chatml`, or give one in chat_template_jinja"
    )


def _jinja_text(value: str, base_dir: Path | None) -> str:
    """chat_template_jinja as axolotl reads it: a template (it has `{{` or `{%`), else a file's path."""
    if "{{" in value or "{%" in value:
        return value
    path = Path(os.path.expanduser(value))
    path = path if path.is_absolute() else (base_dir or Path.cwd()) / path
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"chat_template_jinja: cannot read the template file {path}: {exc}") from exc


def render(tokenizer: Any, template: str, turns: Sequence[Turn], where: str) -> str:
    """The conversation as the template writes it (no generation prompt). Raises DatasetError."""
    from jinja2 import TemplateError

    messages = [{"role": t.role, "content": t.content} for t in turns]
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    except TemplateError as exc:
        raise DatasetError(f"{where}: the chat template refuses this conversation: {exc}") from exc
    if not isinstance(text, str):  # pragma: no cover - tokenize=False always gives text
        raise DatasetError(f"{where}: the chat template gave {type(text).__name__}, not text")
    return text


def trained_spans(
    conv: Conversation, tokenizer: Any, template: str, where: str
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans to train (content, and end markers)."""
    full = render(tokenizer, template, conv.turns, where)
    spans: list[tuple[int, int]] = []
    last = len(conv.turns) - 1
    for i, turn in enumerate(conv.turns):
        trained = turn.role in conv.roles_to_train
        eos = conv.train_on_eos == "all" or (
            (conv.train_on_eos == "turn" and trained) or (conv.train_on_eos == "last" and i == last)
        )
        if not (trained or eos):
            continue
        start, end, marker = _locate(tokenizer, template, conv.turns, i, full, where)
        if trained:
            spans.append((start, end))
        if eos and marker:
            spans.append((end, end + marker))
    return full, spans


def _locate(
    tokenizer: Any, template: str, turns: Sequence[Turn], i: int, full: str, where: str
) -> tuple[int, int, int]:
    """Where turn i's content is in `full` (start, end) and its end marker's length after it."""
    probe = render(tokenizer, template, [*turns[:i], Turn(turns[i].role, _MARK)], where)
    at = probe.find(_MARK)
    content = turns[i].content
    found = next((text for text in (content, content.strip()) if at >= 0 and full.startswith(text, at)), None)
    if found is None or full[:at] != probe[:at]:
        raise DatasetError(
            f"{where}: the chat template rewrites turn {i} ({turns[i].role}), so its tokens cannot be "
            "told apart; use a template that writes each message's content as given"
        )
    end = at + len(found)
    after, rest = probe[at + len(_MARK) :], full[end:]
    common = 0
    while common < min(len(after), len(rest)) and after[common] == rest[common]:
        common += 1
    return at, end, len(after[:common].rstrip())


def tokenize_conversation(
    conv: Conversation, tokenizer: Any, template: str, train_on_inputs: bool, where: str
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of one conversation: labels IGNORE_INDEX outside the trained spans."""
    full, spans = trained_spans(conv, tokenizer, template, where)
    if not getattr(tokenizer, "is_fast", False):
        raise DatasetError("chat data needs a fast tokenizer (with character offsets)")
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    if train_on_inputs:
        return ids, ids.copy()
    labels = [
        token if b > a and any(a < hi and b > lo for lo, hi in spans) else IGNORE_INDEX
        for token, (a, b) in zip(ids, encoded["offset_mapping"], strict=True)
    ]
    return ids, labels


def tokenize_segments(seg: Segments, tokenizer: Any, train_on_inputs: bool) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of input_output segments: each tokenized alone, no special tokens added."""
    ids: list[int] = []
    labels: list[int] = []
    for text, label in seg.parts:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        ids += piece
        labels += piece if (label or train_on_inputs) else [IGNORE_INDEX] * len(piece)
    return ids, labels
