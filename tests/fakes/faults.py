"""What every fake's scripted misbehaviour shares: a rule for one operation (or "*"), consumed `times`
times, parsed from the JSON posted to /_fake/faults. Each fake subclasses it with its kinds and extras."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Self


@dataclass
class FaultRule:
    op: str
    kind: str
    times: int = 1
    retry_after: float = 1.0

    KINDS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """Validate one rule: a known kind, and every other field given converted to its declared type."""
        kind = str(data["kind"])
        if kind not in cls.KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; valid: {sorted(cls.KINDS)}")
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {"op": str(data.get("op", "*")), "kind": kind}
        for f in fields(cls):
            if f.init and f.name not in values and data.get(f.name) is not None:
                values[f.name] = _convert(hints[f.name], data[f.name])
        return cls(**values)


def _convert(hint: Any, value: Any) -> Any:
    """`value` as the field's type: int, float, bool, str, or an optional one of those."""
    options = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return options[0](value)
