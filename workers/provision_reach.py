"""provision's reading of why a starting node's Ray head does not answer (`NodeInstance.unanswered`, which
the provider's probe tells apart: providers.reach).

Each cause is said once per instance, when provision first meets it (`node.unreachable`, recorded in
`RunProgress.unreached`), not once per poll: a proxy's 502 or a refused port is how every node boots. A
certificate the fleet's check refuses (untrusted, for another name, not the one pinned for the node) does
not heal by waiting, so the run gives up on it `node_tls_fail_after_s` after it first met it, naming it
(NODE_UNREACHABLE) instead of waiting out `node_ready_timeout_s`; a booting node's cause is waited out,
and named in the NODE_TIMEOUT that ends a wait in vain.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from core.errors import Unreachable
from providers.base import NodeInstance, NodeState, Unanswered
from state.ledger import Draft
from state.models import Run, Unreached
from state.payloads import NodeUnreachable
from workers import context

ADVICE = {
    Unreachable.CERTIFICATE: "no authority the fleet trusts for it signed the certificate it presents",
    Unreachable.HOSTNAME: "the certificate it presents is for another name than the one the fleet called",
    Unreachable.PIN: "it presents another certificate than the one the fleet made for the node and pinned: "
    "something else answers at that address",
}


def _noted(run: Run, name: str, cause: Unreachable) -> Unreached | None:
    return next((u for u in run.progress.unreached if u.instance == name and u.cause == cause), None)


def _met(nodes: Mapping[str, NodeInstance]) -> dict[str, Unanswered]:
    return {name: found.unanswered for name, found in nodes.items() if found.unanswered is not None}


def note(ctx: context.Context, run: Run, nodes: Mapping[str, NodeInstance]) -> Run:
    """Record and say (node.unreachable) each cause the nodes' probes met that was not said yet for that
    instance; returns the run as recorded."""
    met = _met(nodes)
    if all(_noted(run, name, why.cause) is not None for name, why in met.items()):
        return run
    bound = ctx.settings.node_tls_fail_after_s

    def record(r: Run) -> list[Draft]:
        drafts: list[Draft] = []
        now = time.time()
        for name, why in met.items():
            if _noted(r, name, why.cause) is not None:
                continue
            seen = Unreached(
                instance=name, cause=why.cause, since=now, detail=why.detail, endpoint=why.endpoint
            )
            r.progress.unreached = [*r.progress.unreached, seen]
            permanent = why.cause.permanent
            drafts.append(
                NodeUnreachable(
                    instance=name,
                    cause=why.cause,
                    endpoint=why.endpoint,
                    detail=why.detail,
                    permanent=permanent,
                    gives_up_at=now + bound if permanent else None,
                )
            )
        return drafts

    return ctx.ledger.update_run(run.run_id, record)


def _refused(run: Run, nodes: Mapping[str, NodeInstance]) -> list[Unreached]:
    """The permanent causes met for instances that are not up (a certificate the check refused): none of
    them has answered since, whatever its probe meets now (a proxy that stalls on the fleet, say)."""
    waiting = {name for name, found in nodes.items() if found.state != NodeState.RUNNING}
    return [u for u in run.progress.unreached if u.cause.permanent and u.instance in waiting]


def gives_up_at(ctx: context.Context, run: Run, nodes: Mapping[str, NodeInstance]) -> float | None:
    """When the run gives up on a node for a permanent cause (the earliest), or None."""
    return min((u.since + ctx.settings.node_tls_fail_after_s for u in _refused(run, nodes)), default=None)


def given_up(ctx: context.Context, run: Run, nodes: Mapping[str, NodeInstance]) -> str | None:
    """Why the run gives up on its nodes now (a permanent cause met `node_tls_fail_after_s` ago, and the
    node not up since), or None."""
    now = time.time()
    for seen in _refused(run, nodes):
        if now < seen.since + ctx.settings.node_tls_fail_after_s:
            continue
        latest = nodes[seen.instance].unanswered
        changed = latest is not None and latest.cause != seen.cause
        later = f" (its probe meets {latest.cause.value} now)" if latest is not None and changed else ""
        return (
            f"instance {seen.instance}: the fleet cannot reach its Ray head at {seen.endpoint}: "
            f"{seen.cause.value}: {seen.detail}, since {now - seen.since:.0f} s{later}; "
            + _advice(ctx, run, seen)
        )
    return None


def _advice(ctx: context.Context, run: Run, seen: Unreached) -> str:
    """What the cause means, and what of the cloud's settings decides it (its proxy's authorities...)."""
    said = ctx.provider(run.provider).reach_advice(seen.cause)
    return f"{ADVICE[seen.cause]} ({said})" if said else ADVICE[seen.cause]


def last_words(run: Run, nodes: Mapping[str, NodeInstance], late: Iterable[str]) -> str:
    """What the late instances' heads said last, for the message of a wait in vain ('' when nothing)."""
    said = []
    for name in late:
        found = nodes.get(name)
        if found is not None and found.unanswered is not None:
            said.append(f"instance {name}'s Ray head does not answer: {found.unanswered}")
            continue
        causes = [f"{u.cause.value} ({u.detail})" for u in run.progress.unreached if u.instance == name]
        if causes:
            said.append(f"instance {name}'s Ray head did not answer: {', then '.join(causes)}")
    return "; ".join(said)
