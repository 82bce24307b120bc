"""Just enough GraphQL for the RunPod fake: parse an operation and project resolved data onto it.

runpod-python builds its queries as f-strings with inline input literals and no variables, so literal
values (strings with escapes, numbers, booleans, null, enums, lists, objects) must parse exactly as a
GraphQL server parses them; our own client sends `$variables`, which are substituted at execution.
Named and inline fragments are expanded in place (their type conditions are not checked: every client we
fake against spreads a fragment only where its type fits); `@include(if:)` and `@skip(if:)` are honoured.
Checking the document against a schema is the schema's (tests.fakes.runpod_schema.validate), before
anything is resolved; `project` then shapes the resolved data as the selections ask.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(
    r"""
    (?P<skip>[\s,\ufeff]+|\#[^\n]*)
  | (?P<block>\"\"\"(?:\\\"\"\"|[^"]|"(?!""))*\"\"\")
  | (?P<string>"(?:\\.|[^"\\\n])*")
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
  | (?P<punct>\.\.\.|[{}()\[\]:$!=@|&])
    """,
    re.VERBOSE,
)
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class GraphQLError(Exception):
    """A request the fake server rejects the way a GraphQL server does (an entry in `errors`)."""


@dataclass(frozen=True)
class Var:
    """A `$name` reference, resolved from the request's variables at execution."""

    name: str


class Enum(str):
    """An enum literal (`cloudType: SECURE`): compares equal to its name."""


@dataclass
class Field:
    """One selected field with its arguments and sub-selection (None for a leaf)."""

    name: str
    alias: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    selections: list[Field] | None = None
    conditions: list[tuple[str, Any]] = field(default_factory=list)  # ("include" | "skip", literal or Var)

    def selected(self, variables: dict[str, Any]) -> bool:
        """Whether the field's directives keep it, with these variables."""
        for name, value in self.conditions:
            if bool(substitute(value, variables)) != (name == "include"):
                return False
        return True

    @property
    def key(self) -> str:
        """The key this field has in the response."""
        return self.alias or self.name


@dataclass
class Operation:
    """A parsed `query` or `mutation`, with its declared variables' types as written (`PodFilter!`) and its
    name (None when anonymous)."""

    kind: str
    fields: list[Field]
    variables: dict[str, str] = field(default_factory=dict)
    name: str | None = None


def _unescape(raw: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            out.append(chr(int(raw[i + 2 : i + 6], 16)))
            i += 6
        elif nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            raise GraphQLError(f"Syntax Error: Invalid character escape sequence: \\{nxt}")
    return "".join(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise GraphQLError(f"Syntax Error: Unexpected character {text[pos]!r}")
            kind = match.lastgroup or ""
            if kind != "skip":
                self.tokens.append((kind, match.group()))
            pos = match.end()
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("eof", "<EOF>")

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if got_kind != kind or (value is not None and got != value):
            want = value or kind.capitalize()
            raise GraphQLError(f'Syntax Error: Expected {want}, found {got_kind.capitalize()} "{got}".')
        self.i += 1
        return got

    def at(self, value: str) -> bool:
        return self.peek()[1] == value and self.peek()[0] == "punct"

    def operation(self) -> Operation:
        kind, declared, name = "query", dict[str, str](), None
        if self.peek()[0] == "name":
            kind = self.take("name")
            if kind not in ("query", "mutation"):
                raise GraphQLError(f'Syntax Error: Unexpected Name "{kind}".')
            if self.peek()[0] == "name":
                name = self.take("name")
            if self.at("("):
                declared = self.variable_definitions()
        fields = self.selection_set()
        fragments: dict[str, list[Field]] = {}
        while self.peek() == ("name", "fragment"):
            self.take("name")
            name = self.take("name")
            self.take("name", "on")
            self.take("name")
            fragments[name] = self.selection_set()
        if self.peek()[0] != "eof":
            raise GraphQLError("Syntax Error: only one operation per request is supported.")
        return Operation(kind, _expand(fields, fragments), declared, name)

    def variable_definitions(self) -> dict[str, str]:
        """`($a: Type!, $b: [Type] = default)`: each variable's type as text (defaults are read, unused)."""
        declared: dict[str, str] = {}
        self.take("punct", "(")
        while not self.at(")"):
            self.take("punct", "$")
            name = self.take("name")
            self.take("punct", ":")
            declared[name] = self.type_ref()
            if self.at("="):
                self.take("punct", "=")
                self.value()
        self.take("punct", ")")
        return declared

    def type_ref(self) -> str:
        if self.at("["):
            self.take("punct", "[")
            text = f"[{self.type_ref()}]"
            self.take("punct", "]")
        else:
            text = self.take("name")
        if self.at("!"):
            self.take("punct", "!")
            text += "!"
        return text

    def selection_set(self) -> list[Field]:
        self.take("punct", "{")
        fields = []
        while not self.at("}"):
            if self.at("..."):
                self.take("punct", "...")
                if self.peek() == ("name", "on"):  # an inline fragment: its fields, here
                    self.take("name")
                    self.take("name")
                    fields.extend(self.selection_set())
                else:
                    fields.append(Field(_SPREAD, alias=self.take("name")))
                continue
            name = self.take("name")
            alias = None
            if self.at(":"):
                self.take("punct", ":")
                alias, name = name, self.take("name")
            args: dict[str, Any] = {}
            if self.at("("):
                self.take("punct", "(")
                while not self.at(")"):
                    key = self.take("name")
                    self.take("punct", ":")
                    args[key] = self.value()
                self.take("punct", ")")
            conditions = self.directives()
            subs = self.selection_set() if self.at("{") else None
            fields.append(Field(name, alias, args, subs, conditions))
        self.take("punct", "}")
        return fields

    def directives(self) -> list[tuple[str, Any]]:
        """`@include(if: ...)` / `@skip(if: ...)` after a field."""
        found = []
        while self.at("@"):
            self.take("punct", "@")
            name = self.take("name")
            if name not in ("include", "skip"):
                raise GraphQLError(f'Unknown directive "@{name}".')
            self.take("punct", "(")
            self.take("name", "if")
            self.take("punct", ":")
            found.append((name, self.value()))
            self.take("punct", ")")
        return found

    def value(self) -> Any:
        kind, text = self.peek()
        if kind == "punct" and text == "$":
            self.take("punct", "$")
            return Var(self.take("name"))
        if kind == "punct" and text == "[":
            self.take("punct", "[")
            items = []
            while not self.at("]"):
                items.append(self.value())
            self.take("punct", "]")
            return items
        if kind == "punct" and text == "{":
            self.take("punct", "{")
            obj: dict[str, Any] = {}
            while not self.at("}"):
                key = self.take("name")
                self.take("punct", ":")
                obj[key] = self.value()
            self.take("punct", "}")
            return obj
        self.i += 1
        if kind == "string":
            return _unescape(text[1:-1])
        if kind == "block":
            return text[3:-3].replace('\\"""', '"""')
        if kind == "number":
            return json.loads(text)
        if kind == "name":
            return {"true": True, "false": False, "null": None}.get(text, Enum(text))
        self.i -= 1
        raise GraphQLError(f'Syntax Error: Unexpected {kind.capitalize()} "{text}".')


_SPREAD = "..."


def _expand(
    fields: list[Field], fragments: dict[str, list[Field]], seen: tuple[str, ...] = ()
) -> list[Field]:
    """`fields` with each `...Name` spread replaced by the named fragment's fields."""
    out: list[Field] = []
    for f in fields:
        if f.name == _SPREAD:
            name = str(f.alias)
            if name not in fragments:
                raise GraphQLError(f'Unknown fragment "{name}".')
            if name in seen:
                raise GraphQLError(f'Cannot spread fragment "{name}" within itself.')
            out.extend(_expand(fragments[name], fragments, (*seen, name)))
        else:
            subs = _expand(f.selections, fragments, seen) if f.selections is not None else None
            out.append(Field(f.name, f.alias, f.args, subs, f.conditions))
    return out


def parse(text: str) -> Operation:
    """Parse one GraphQL operation (raises GraphQLError with a server-like message)."""
    return _Parser(text).operation()


def substitute(value: Any, variables: dict[str, Any]) -> Any:
    """Replace `$var` references inside a literal with the request's variables."""
    if isinstance(value, Var):
        return variables.get(value.name)
    if isinstance(value, list):
        return [substitute(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, variables) for k, v in value.items()}
    return value


def named_type(type_text: str) -> str:
    """The named type inside a type reference: `[Pod!]!` -> `Pod`."""
    return type_text.strip("[]!")


def project(
    value: Any,
    selections: list[Field] | None,
    variables: dict[str, Any],
    type_name: str,
    outputs: Mapping[str, Mapping[str, str]] | None = None,
) -> Any:
    """Keep only the selected fields of resolved data (a callable value is a field taking arguments).

    `type_name` is the value's type. With `outputs` (each object type's fields and their types: the schema
    the document was validated against) a selected field the data lacks is the fake's own gap, since
    validation has refused the caller's mistakes already; without it the data is the schema, and a field
    it lacks is refused as a server refuses an unknown field."""
    if selections is None or value is None:
        return value
    if isinstance(value, list):
        return [project(v, selections, variables, type_name, outputs) for v in value]
    out: dict[str, Any] = {}
    for sel in selections:
        if not sel.selected(variables):
            continue
        if sel.name == "__typename":
            out[sel.key] = type_name
            continue
        if sel.name not in value:
            if outputs is not None:
                raise GraphQLError(f'The fake resolves no "{type_name}.{sel.name}" (its schema declares it).')
            raise GraphQLError(f'Cannot query field "{sel.name}" on type "{type_name}".')
        item = value[sel.name]
        if callable(item):
            item = item(substitute(sel.args, variables))
        child = named_type(outputs[type_name][sel.name]) if outputs is not None else sel.name
        out[sel.key] = project(item, sel.selections, variables, child, outputs)
    return out
