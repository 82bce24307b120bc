"""A YAML reader for files that come from people we do not fully trust.

`load_yaml` returns plain data (dicts with ``str`` keys, lists, str, int, float, bool, None) and a map from
each key path ("runpod.gpu_count", "datasets[0].path") to its 1-based line. It never raises anything but
`ConfigError`, and it refuses, naming the problem and its line:

- files over `MAX_BYTES` (checked before any parsing) and bytes that are not UTF-8;
- every tag except YAML's core ones (str, int, float, bool, null, map, seq): no ``!!python/...``, no
  ``!custom``, no ``!!binary``/``!!timestamp``/``!!set``/``!!omap``;
- aliases (``*name``) of any kind, and merge keys (``<<``). Refusing aliases outright, rather than
  budgeting their expansions, makes "billion laughs" bombs fail at the first alias, in microseconds and with
  no memory growth; a training config never needs them;
- nesting deeper than `MAX_DEPTH`, keys that are not scalars, duplicate keys at any level (both lines named);
- a top level that is not a mapping, and YAML syntax errors.

Two deliberate departures from ``yaml.safe_load``: keys are always the key's text (``1:`` and ``yes:`` give
the keys "1" and "yes"), and date-like values stay strings (no ``datetime``), so the data is always JSON.
Values otherwise follow PyYAML's YAML 1.1 rules (``yes``/``on`` are true), as axolotl's own loader does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from core.errors import ConfigError, Problem

MAX_BYTES = 256 * 1024
"""Largest accepted file. A real axolotl config is a few KiB; 256 KiB is the limit in notes/reliability F6."""

MAX_DEPTH = 32
"""Deepest accepted nesting of mappings and sequences."""

_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null"))
_MAP_TAG = _CORE + "map"
_SEQ_TAG = _CORE + "seq"
# Implicit resolvers we drop: timestamps (datetime is not JSON), "=" (the obscure !!value) and "<<" (merge
# keys are refused by name instead; without aliases they have no use).
_DROPPED_RESOLVERS = frozenset(_CORE + t for t in ("timestamp", "value", "merge"))


@dataclass(frozen=True)
class YamlDocument:
    """A parsed file: its data (a mapping), the decoded text, and the line of every key path."""

    data: dict[str, Any]
    lines: dict[str, int]
    text: str


def join_path(parent: str, key: str | int) -> str:
    """The key path of `key` under `parent`: ``join_path("datasets", 0) == "datasets[0]"``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else key


class _Refused(Exception):
    """Raised inside the composer to stop at once (aliases, depth); carries the line."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and deep nesting while composing, and resolves no timestamps."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _DROPPED_RESOLVERS]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(AliasEvent):
            event = self._next_event()
            message = f"aliases are not allowed (*{event.anchor}); write the value out in full"
            raise _Refused(event.start_mark.line + 1, message)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                line = self._next_event().start_mark.line + 1
                raise _Refused(line, f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _next_event(self) -> Any:
        return self.peek_event()  # type: ignore[no-untyped-call]


def read_job_file(path: Path) -> bytes:
    """The bytes of a job (or sweep) file, at most `MAX_BYTES + 1` of them. Only a regular file is read: a
    FIFO would block the reader for ever, a device may never end, a directory is not a file; each is refused
    at once, by a stat before opening (and an fstat after, opened without blocking, should it change in
    between). Raises ConfigError naming the file."""
    source = str(path)
    try:
        _regular(os.stat(path).st_mode, source)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            status = os.fstat(fh.fileno())
            _regular(status.st_mode, source)
            if status.st_size > MAX_BYTES:  # refuse before reading; load_yaml checks again what was read
                message = f"file is {status.st_size} bytes; the limit is {MAX_BYTES} bytes"
                raise ConfigError(source, [Problem("", message)])
            return fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, [Problem("", f"cannot read the file: {exc.strerror or exc}")]) from None


def _regular(mode: int, source: str) -> None:
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, device or socket"
        raise ConfigError(
            source, [Problem("", f"{kind}, not a regular file; a job file must be a plain file")]
        )


def load_yaml(data: bytes, *, source: str) -> YamlDocument:
    """Parse `data` (a whole file) into a `YamlDocument`; raise `ConfigError` naming `source` otherwise."""
    if len(data) > MAX_BYTES:
        raise ConfigError(source, [Problem("", f"file is {len(data)} bytes; the limit is {MAX_BYTES} bytes")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start : exc.start + 1].hex()
        message = f"the file must be UTF-8 text (byte 0x{bad} is not valid UTF-8)"
        raise ConfigError(source, [Problem("", message, line)]) from None
    root = _compose(text, source)
    if root is None:
        raise ConfigError(source, [Problem("", "the file is empty; expected a mapping of keys", 1)])
    walker = _Walker(source)
    value = walker.build(root, "")
    if walker.problems:
        raise ConfigError(source, walker.problems)
    if not isinstance(value, dict):
        message = f"the top level must be a mapping of keys, not {_kind(root)}"
        raise ConfigError(source, [Problem("", message, root.start_mark.line + 1)])
    return YamlDocument(data=value, lines=walker.lines, text=text)


def _compose(text: str, source: str) -> Node | None:
    loader: _Loader | None = None
    try:
        loader = _Loader(text)
        return loader.get_single_node()
    except _Refused as exc:
        raise ConfigError(source, [Problem("", exc.message, exc.line)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = exc.problem or exc.context or "unreadable"
        if exc.context and exc.problem:
            at = f" at line {exc.context_mark.line + 1}" if exc.context_mark is not None else ""
            what += f" ({exc.context}{at})"
        raise ConfigError(source, [Problem("", f"YAML syntax error: {what}", line)]) from None
    except yaml.reader.ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        message = f"character #x{exc.character:04x} is not allowed in a YAML file"
        raise ConfigError(source, [Problem("", message, line)]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [Problem("", f"YAML error: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _kind(node: Node) -> str:
    if isinstance(node, SequenceNode):
        return "a list"
    if isinstance(node, MappingNode):
        return "a mapping"
    return "a single value"


class _Walker:
    """Turns a composed node tree into plain data, recording key lines and collecting problems."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []
        self._constructor = yaml.SafeLoader("")

    def build(self, node: Node, path: str) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, MappingNode):
            if node.tag != _MAP_TAG:
                return self._bad_tag(node, path)
            return self._mapping(node, path)
        if isinstance(node, SequenceNode):
            if node.tag != _SEQ_TAG:
                return self._bad_tag(node, path)
            items = []
            for i, item in enumerate(node.value):
                self.lines.setdefault(join_path(path, i), item.start_mark.line + 1)
                items.append(self.build(item, join_path(path, i)))
            return items
        if node.tag not in _SCALAR_TAGS:
            return self._bad_tag(node, path)
        try:
            return self._constructor.construct_object(node)
        except (ValueError, KeyError, IndexError, TypeError, OverflowError, yaml.YAMLError):
            # An explicit core tag on a value it cannot read (``!!int abc``, ``!!bool maybe``).
            tag = node.tag.replace(_CORE, "!!")
            self.problems.append(Problem(path, f"{node.value!r} is not a valid {tag}", line))
            return None

    def _mapping(self, node: MappingNode, path: str) -> dict[str, Any]:
        result: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, ScalarNode):
                self.problems.append(Problem(path, "keys must be plain names, not lists or mappings", line))
                continue
            key = str(key_node.value)
            child = join_path(path, key)
            if key_node.tag not in _SCALAR_TAGS:
                self._bad_tag(key_node, child)
                continue
            if key == "<<" and key_node.style is None:
                message = "merge keys (<<) are not allowed; write the keys out"
                self.problems.append(Problem(child, message, line))
                continue
            if key in seen:
                message = f"duplicate key {key!r} (first at line {seen[key]}, again at line {line})"
                self.problems.append(Problem(child, message, line))
                continue
            seen[key] = line
            self.lines[child] = line
            result[key] = self.build(value_node, child)
        return result

    def _bad_tag(self, node: Node, path: str) -> None:
        tag = node.tag.replace(_CORE, "!!")
        message = f"tag {tag} is not allowed; only plain YAML values (no !tags) are accepted"
        self.problems.append(Problem(path, message, node.start_mark.line + 1))
