"""Fault injection for tests: the FLEET_INJECT environment variable, read once per worker; unset, nothing.
The fleet sets it for a drill (its setting fault_injection); a job file cannot (core.envnames).

FLEET_INJECT holds comma-separated ``name:value`` items; a value may end in ``@R`` to act on worker rank R
only (default: every rank).

- ``nan_at_step:K``: the loss of optimizer step K is NaN (every micro batch of it), once per process, so
  that the watchdog's rollback replays step K normally. ``nan_at_step:*``: every step, every time.
- ``crash_after_step:N``: raise InjectedCrash once step N is done (its checkpoint written, if it has one).
  A run resumed at step N or later never gets there again.
- ``memory_cap_mb:N``: auto_find_batch_size's trial steps fail as out of memory when the activations that
  autograd keeps for the backward pass exceed N MiB (a CPU has no allocator limit a test could hit).

Under Ray the variable must reach the workers: a local cluster inherits the driver's environment, a Ray
job passes it in its runtime_env env_vars. Malformed values raise JobError rather than being ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from trainer.errors import JobError

ENV_VAR = "FLEET_INJECT"
EVERY = "*"


class Fault(StrEnum):
    """The faults a test can ask for."""

    NAN_AT_STEP = "nan_at_step"
    CRASH_AFTER_STEP = "crash_after_step"
    MEMORY_CAP_MB = "memory_cap_mb"


class InjectedCrash(RuntimeError):
    """The crash that ``crash_after_step`` asked for (an ordinary exception, as a bug would raise)."""


@dataclass(frozen=True)
class Faults:
    """The parsed FLEET_INJECT: per fault, its value and the rank it is limited to (None: every rank)."""

    items: Mapping[Fault, tuple[str, int | None]] = field(default_factory=dict)

    def _value(self, fault: Fault, rank: int) -> str | None:
        value, only = self.items.get(fault, (None, None))
        return value if only is None or only == rank else None

    def nan_at(self, step: int, rank: int) -> bool:
        """Whether `step`'s loss is to be NaN on `rank` (before the once-per-process rule)."""
        value = self._value(Fault.NAN_AT_STEP, rank)
        return value is not None and (value == EVERY or int(value) == step)

    def nan_every_step(self) -> bool:
        return self.items.get(Fault.NAN_AT_STEP, ("", None))[0] == EVERY

    def crash_after(self, step: int, rank: int) -> bool:
        value = self._value(Fault.CRASH_AFTER_STEP, rank)
        return value is not None and int(value) == step

    def memory_cap_bytes(self, rank: int) -> int | None:
        value = self._value(Fault.MEMORY_CAP_MB, rank)
        return None if value is None else int(float(value) * 2**20)


def parse(text: str) -> Faults:
    """FLEET_INJECT's value as Faults; JobError naming the bad item when one does not parse."""
    items: dict[Fault, tuple[str, int | None]] = {}
    for raw in (part.strip() for part in text.split(",")):
        if not raw:
            continue
        name, sep, rest = raw.partition(":")
        try:
            fault = Fault(name.strip())
        except ValueError:
            known = ", ".join(f.value for f in Fault)
            raise JobError(f"{ENV_VAR}: unknown fault {name!r} in {raw!r} (known: {known})") from None
        value, at, rank_text = rest.strip().partition("@")
        if not sep or not _valid(fault, value) or (at and not rank_text.isdigit()):
            raise JobError(f"{ENV_VAR}: {raw!r} is not {fault.value}:{_shape(fault)}[@RANK]")
        items[fault] = (value, int(rank_text) if at else None)
    return Faults(items)


def from_env(environ: Mapping[str, str]) -> Faults:
    """The faults `environ` asks for (none when FLEET_INJECT is unset or empty)."""
    return parse(environ.get(ENV_VAR, ""))


def _shape(fault: Fault) -> str:
    return {Fault.NAN_AT_STEP: "STEP|*", Fault.CRASH_AFTER_STEP: "STEP", Fault.MEMORY_CAP_MB: "MB"}[fault]


def _valid(fault: Fault, value: str) -> bool:
    if fault == Fault.NAN_AT_STEP and value == EVERY:
        return True
    if fault == Fault.MEMORY_CAP_MB:
        try:
            mb = float(value)
        except ValueError:
            return False
        return math.isfinite(mb) and mb > 0
    return value.isdigit() and int(value) >= 1
