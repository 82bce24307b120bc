"""The builtin recipe's dataset formats (`datasets[i].type`) as axolotl means them, from a row to a record.

- `alpaca`: `instruction`, optional `input`, `output`; trained on the output (and EOS).
- `completion`: one text field (`field`, default `text`); trained on all of it.
- `chat_template`: a list of messages (`field_messages`, default `messages`), each a mapping whose role
  and content keys `message_property_mappings` names (default `role` / `content`); source roles map to
  the template's through `roles` (default: human and user -> user, gpt and assistant -> assistant, system,
  tool). Only the turns of `roles_to_train` (default assistant) are trained, and their end-of-turn marker
  as `train_on_eos` says (turn: each trained turn's, all, last, none). The template is the job's top-level
  `chat_template` / `chat_template_jinja` (`ChatKeys`; trainer.chat renders it).
- `sharegpt`: axolotl now reads sharegpt data through chat_template (its `type: sharegpt` is retired);
  here it is that reading: `conversations` of `{from, value}` with human/gpt roles.
- `input_output`: `segments` of `{text, label}`; the text is joined as written (no BOS, no EOS, as
  axolotl does) and the segments with `label: true` are trained.

Every row error is a `RowError` saying what the row lacks, so the validate-time check (jobs.dataset_check)
and the node tell the same story.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from trainer.errors import DatasetError

if TYPE_CHECKING:
    from trainer.config import DatasetConfig

ChatTemplateName = Literal["tokenizer_default", "chatml", "jinja", "tokenizer_default_fallback_chatml"]
TrainOnEos = Literal["turn", "all", "last", "none"]
CHAT_TYPES = frozenset({"chat_template", "sharegpt"})
DEFAULT_ROLES = {
    "user": ["human", "user"],
    "assistant": ["gpt", "assistant"],
    "system": ["system"],
    "tool": ["tool"],
}
SHAREGPT_MAPPINGS = {"role": "from", "content": "value"}
DEFAULT_MAPPINGS = {"role": "role", "content": "content"}


class ChatKeys(BaseModel):
    """The job's chat template (top-level keys, as axolotl names them), for chat_template/sharegpt data."""

    chat_template: ChatTemplateName | None = Field(
        None,
        description="tokenizer_default (the tokenizer's own template; the default), chatml, "
        "tokenizer_default_fallback_chatml, or jinja (chat_template_jinja).",
    )
    chat_template_jinja: str | None = Field(
        None, min_length=1, description="A Jinja chat template, or the path of a file holding one."
    )

    @field_validator("chat_template", mode="before")
    @classmethod
    def _known_template(cls, value: Any) -> Any:
        known = ("tokenizer_default", "chatml", "jinja", "tokenizer_default_fallback_chatml")
        if value is not None and value not in known:
            raise ValueError(
                f"the builtin recipe has the chat templates {', '.join(known)}; "
                f"for {value!r} use `trainer: axolotl`"
            )
        return value

    @model_validator(mode="after")
    def _jinja_given(self) -> ChatKeys:
        if self.chat_template == "jinja" and not self.chat_template_jinja:
            raise ValueError("chat_template: jinja needs the template in chat_template_jinja")
        if self.chat_template_jinja and self.chat_template not in (None, "jinja"):
            raise ValueError("chat_template_jinja is used only with chat_template: jinja (or unset)")
        return self


class DatasetFormatKeys(BaseModel):
    """The keys of one `datasets:` entry that say how its rows read (chat and segment formats)."""

    field_messages: str | None = Field(
        None,
        min_length=1,
        description="The messages field (chat_template: messages; sharegpt: conversations).",
    )
    message_property_mappings: dict[str, str] | None = Field(
        None, description="Where a message's role and content are: {role: from, content: value}."
    )
    roles: dict[str, list[str]] | None = Field(
        None, description="Template role -> the source roles that mean it (default: human/gpt mapped)."
    )
    roles_to_train: list[str] = Field(
        default_factory=lambda: ["assistant"], description="The roles whose turns are trained."
    )
    train_on_eos: TrainOnEos = Field(
        "turn", description="End-of-turn markers trained: each trained turn's, all, the last one, none."
    )
    drop_system_message: bool = Field(False, description="Leave system turns out of the conversation.")

    @field_validator("message_property_mappings")
    @classmethod
    def _role_and_content(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        unknown = sorted(set(value or {}) - {"role", "content"})
        if unknown:
            raise ValueError(f"only `role` and `content` are mapped here; not {', '.join(unknown)}")
        return value


@dataclass(frozen=True)
class Turn:
    """One message of a conversation, its role already mapped to the template's."""

    role: str
    content: str


@dataclass(frozen=True)
class Conversation:
    """A chat example: its turns and which of them (and of their end markers) are trained."""

    turns: tuple[Turn, ...]
    roles_to_train: frozenset[str]
    train_on_eos: TrainOnEos
    where: str = field(default="", compare=False)  # the row, for errors


@dataclass(frozen=True)
class Segments:
    """An input_output example: pieces of text, each trained or not."""

    parts: tuple[tuple[str, bool], ...]


class RowError(DatasetError):
    """A row without what its dataset's `type` needs; `detail` says what ("has no `output`")."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where} {detail}")
        self.detail = detail


def needs(ds: DatasetConfig) -> str:
    """What a row of `ds` must have, in words: "`instruction` and `output`"."""
    if ds.type == "alpaca":
        return "`instruction` and `output`"
    if ds.type == "completion":
        return f"`{ds.field}`"
    if ds.type == "input_output":
        return "`segments`: a list of {text, label}"
    role, content = _mappings(ds)["role"], _mappings(ds)["content"]
    return f"`{messages_field(ds)}`: a list of {{{role}, {content}}}"


def messages_field(ds: DatasetConfig) -> str:
    """The field holding a chat row's messages."""
    return ds.field_messages or ("conversations" if ds.type == "sharegpt" else "messages")


def _mappings(ds: DatasetConfig) -> dict[str, str]:
    base = SHAREGPT_MAPPINGS if ds.type == "sharegpt" else DEFAULT_MAPPINGS
    return {**base, **(ds.message_property_mappings or {})}


def role_map(ds: DatasetConfig) -> dict[str, str]:
    """Source role -> template role (axolotl's `roles`: {target: [sources]})."""
    return {source: target for target, sources in (ds.roles or DEFAULT_ROLES).items() for source in sources}


def text_of(row: Mapping[str, Any], key: str, where: str, *, required: bool) -> str:
    """`row[key]` as a string ("" when optional and absent). Raises RowError."""
    value = row.get(key)
    if value is None:
        if required:
            raise RowError(where, f"has no `{key}`")
        return ""
    if not isinstance(value, str):
        raise RowError(where, f"has `{key}` as {type(value).__name__}, not a string")
    return value


def conversation_of(ds: DatasetConfig, row: Mapping[str, Any], where: str) -> Conversation:
    """A chat_template/sharegpt row as a Conversation. Raises RowError."""
    name = messages_field(ds)
    messages = row.get(name)
    if messages is None:
        raise RowError(where, f"has no `{name}`")
    if not isinstance(messages, list) or not messages:
        raise RowError(where, f"has `{name}` that is not a list of messages")
    keys, roles = _mappings(ds), role_map(ds)
    turns = []
    for j, message in enumerate(messages):
        at = f"{where} ({name}[{j}])"
        if not isinstance(message, Mapping):
            raise RowError(at, "is not a mapping")
        source = text_of(message, keys["role"], at, required=True)
        if source not in roles:
            known = ", ".join(sorted(roles))
            raise RowError(at, f"has the role {source!r}, which `roles` does not map (known: {known})")
        content = text_of(message, keys["content"], at, required=False)
        if not (ds.drop_system_message and roles[source] == "system"):
            turns.append(Turn(roles[source], content))
    trained = frozenset(roles.get(role, role) for role in ds.roles_to_train)  # `gpt` means assistant
    return Conversation(tuple(turns), trained, ds.train_on_eos, where)


def segments_of(row: Mapping[str, Any], where: str) -> Segments:
    """An input_output row as Segments. Raises RowError."""
    segments = row.get("segments")
    if segments is None:
        raise RowError(where, "has no `segments`")
    if not isinstance(segments, list) or not segments:
        raise RowError(where, "has `segments` that is not a list of {text, label}")
    parts = []
    for j, segment in enumerate(segments):
        at = f"{where} (segments[{j}])"
        if not isinstance(segment, Mapping):
            raise RowError(at, "is not a mapping")
        label = segment.get("label")
        if not isinstance(label, bool):
            raise RowError(at, "has no `label` true or false")
        parts.append((text_of(segment, "text", at, required=False), label))
    return Segments(tuple(parts))
