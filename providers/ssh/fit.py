"""Which machines of a pool a job's `ssh:` section may run on, and why none when none may.

A machine fits when it has every label the section asks, at least `gpu_count` GPUs, and (when the section
names GPU types) one of them. Of those, the smallest first (fewest GPUs, then the cheapest, then as the
pools file lists them), so a small job leaves the big machines to the jobs that need them.
"""

from __future__ import annotations

from collections.abc import Sequence

from providers.base import Refusal
from providers.ssh.pools import Machine, Pools
from providers.ssh.section import SshSection


def fits(machine: Machine, section: SshSection) -> str | None:
    """Why `machine` cannot hold a node of `section`, or None when it can."""
    missing = [label for label in section.labels if label not in machine.labels]
    if missing:
        return f"no label {', '.join(missing)}"
    if machine.gpus < section.gpu_count:
        return f"{machine.gpus} GPUs, fewer than gpu_count: {section.gpu_count}"
    if section.gpu_count and section.gpu is not None and machine.gpu not in section.gpu:
        return f"its GPUs are {machine.gpu or 'none'}, not {' or '.join(section.gpu)}"
    return None


def fitting(machines: Sequence[Machine], section: SshSection) -> list[Machine]:
    """The machines that can hold a node of `section`, the smallest first (the module's notes)."""
    found = [(m.gpus, m.hourly_usd, i, m) for i, m in enumerate(machines) if fits(m, section) is None]
    return [m for *_, m in sorted(found, key=lambda t: t[:3])]


def refusal(pools: Pools, section: SshSection) -> Refusal | None:
    """Why no run of `section` can ever be placed in the pools as declared: no such pool, no machine that
    fits, fewer than `num_nodes` that do. None when enough fit (held or not)."""
    if section.pool not in pools.pools:
        known = ", ".join(sorted(pools.pools)) or "none"
        return Refusal("pool", f"the fleet has no pool {section.pool!r} ({pools.source}); its pools: {known}")
    machines = pools.machines(section.pool)
    fit = fitting(machines, section)
    if not fit:
        why = "; ".join(f"{m.name}: {fits(m, section)}" for m in machines)
        key = (
            "labels"
            if section.labels and all("label" in (fits(m, section) or "") for m in machines)
            else ("gpu" if section.gpu is not None else "gpu_count")
        )
        return Refusal(key, f"no machine of pool {section.pool} fits ({why})")
    if len(fit) < section.num_nodes:
        names = ", ".join(m.name for m in fit)
        return Refusal(
            "num_nodes",
            f"pool {section.pool} has {len(fit)} machine(s) that fit ({names}), not {section.num_nodes}",
        )
    return None
