"""What the notifier says: a run's status embed and the one-off messages, within Discord's limits.

Pure functions of a Run (plus its instance) and events, so rendering twice gives the same message and an
edit is idempotent. Every text goes through `Scrubber` and `fit_embed` before it leaves the process.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from discord.types.embed import Embed as EmbedData
from discord.types.embed import EmbedField

from service.describe import format_value
from service.sweeps import table_lines
from state.models import Instance, Run
from state.payloads import Event, EventType, SweepFinished, SweepSummary
from state.stages import RunState

# Discord's documented limits (https://discord.com/developers/docs/resources/message#embed-object-embed-limits).
TITLE_MAX = 256
THREAD_NAME_MAX = 100  # a channel name, as a thread's is
DESCRIPTION_MAX = 4096
FIELD_NAME_MAX = 256
FIELD_VALUE_MAX = 1024
FIELDS_MAX = 25
EMBED_TOTAL_MAX = 6000
CONTENT_MAX = 2000

COLOURS = {
    RunState.SUCCEEDED: 0x2ECC71,  # green
    RunState.FAILED: 0xE74C3C,  # red
    RunState.CANCELLED: 0x95A5A6,  # grey
}
RUNNING_COLOUR = 0x3498DB  # blue: every state that is not an end

# Events that get a message of their own (besides the status edit): what people must see.
SEPARATE = frozenset(
    {
        EventType.RUN_FAILED,
        EventType.RUN_SUCCEEDED,
        EventType.WANDB_RUN,
        EventType.WANDB_UNAVAILABLE,
        EventType.INSTANCE_KEPT,
        EventType.REAP_TERMINATED,
        EventType.RUN_PREEMPTED,
        EventType.RUN_RETRYING,  # the first failure of a streak only (see _retrying)
        EventType.INSTANCE_IDLE,
        EventType.INSTANCE_REMINDER,
        EventType.INSTANCE_STUCK,
        EventType.INSTANCE_LOST,
        EventType.NODE_JOINED,
        EventType.TRAIN_PENDING,  # the first of a wait only (see _pending)
        EventType.SWEEP_STARTED,
        EventType.SWEEP_FINISHED,
    }
)


def truncate(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, marked with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Scrubber:
    """Replaces every known credential value in a text. Events carry no secrets; this is belt and braces."""

    def __init__(self, values: list[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole. Tiny values would mangle text.
        self.values = sorted({v for v in values if len(v) >= 6}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, "[redacted]")
        return text

    def deep(self, data: Any) -> Any:
        """Scrub every string inside nested dicts and lists."""
        if isinstance(data, str):
            return self(data)
        if isinstance(data, dict):
            return {k: self.deep(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.deep(v) for v in data]
        return data


def _url(value: Any) -> str | None:
    url = value.get("url") if isinstance(value, dict) else None
    return str(url) if url else None


def status_embed(
    run: Run, instance: Instance | None, wandb_url: str | None = None, cost_usd: float | None = None
) -> EmbedData:
    """The status message of a run as an embed (not yet fitted to the limits)."""
    fields: list[EmbedField] = [{"name": "State", "value": run.state.value, "inline": True}]
    if not run.state.is_terminal() and run.state.stage is not None:
        fields.append({"name": "Stage", "value": run.state.stage.value, "inline": True})
    progress = run.progress
    if run.state == RunState.TRAINING and progress.step is not None:
        fields.append({"name": "Step", "value": f"{progress.step}/{progress.total_steps or '?'}"})
        if progress.loss is not None:
            fields.append({"name": "Loss", "value": f"{progress.loss:.4g}", "inline": True})
    if run.metrics.get("eval_loss") is not None:
        fields.append({"name": "Eval loss", "value": f"{run.metrics['eval_loss']:.4g}", "inline": True})
    if run.instance:
        where = run.instance
        if instance is not None and instance.price_per_hour is not None:
            where += f" (${instance.price_per_hour:.3f}/h)"
        fields.append({"name": "Instance", "value": where})
    if cost_usd:
        fields.append({"name": "Cost", "value": f"${cost_usd:.2f}", "inline": True})
    if url := (progress.wandb.url if progress.wandb else None) or wandb_url:
        fields.append({"name": "W&B", "value": url})
    if progress.hub is not None and (url := progress.hub.url):
        fields.append({"name": "Hub", "value": url})
    if run.retrying is not None and not run.state.is_terminal():
        streak = run.retrying
        retrying = f"{streak.stage.value}: {streak.failures} failures since {_when(streak.since)}"
        fields.append({"name": "Retrying", "value": retrying})
    if run.failure_reason is not None:
        fields.append(
            {"name": "Failure", "value": f"{run.failure_reason.value}: {run.failure_message or ''}"}
        )
    return {
        "title": f"{run.run_id} · {run.source}",
        "color": COLOURS.get(run.state, RUNNING_COLOUR),
        "fields": fields,
    }


def thread_name(run: Run) -> str:
    """The name of a run's thread (and the text of the message it starts from): the status title."""
    return truncate(f"{run.run_id} · {run.source}", THREAD_NAME_MAX)


def fit_embed(embed: EmbedData) -> EmbedData:
    """The embed cut to Discord's limits: per-part lengths, 25 fields, 6000 characters in all."""
    out = embed.copy()
    out["title"] = truncate(str(embed.get("title", "")), TITLE_MAX)
    if "description" in embed:
        out["description"] = truncate(str(embed["description"]), DESCRIPTION_MAX)
    budget = EMBED_TOTAL_MAX - len(out["title"]) - len(out.get("description", ""))
    fields: list[EmbedField] = []
    for field in embed.get("fields", [])[:FIELDS_MAX]:
        name = truncate(str(field["name"]), FIELD_NAME_MAX)
        value = truncate(str(field["value"]) or "-", FIELD_VALUE_MAX)
        if len(name) + len(value) > budget:
            break  # dropping the last fields beats a 400 that loses the whole message
        budget -= len(name) + len(value)
        fields.append({**field, "name": name, "value": value})
    out["fields"] = fields
    return out


def _when(epoch: Any) -> str:
    if not isinstance(epoch, int | float):
        return "?"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _cost(data: dict[str, Any]) -> str:
    """The cost line of a run's last message (none for a run that rented nothing)."""
    cost = data.get("cost_usd")
    return f"\ncost: ${cost:.2f}" if isinstance(cost, int | float) and cost > 0 else ""


def separate_message(event: Event) -> str | None:
    """The text of the message of its own that `event` deserves, or None."""
    data, run = event.data.wire(), event.run_id or "-"
    if event.type == EventType.RUN_FAILED:
        message = truncate(str(data.get("message") or ""), 1500)
        return f"❌ Run {run} failed: {data.get('reason') or 'unknown'}\n{message}{_cost(data)}"
    if event.type == EventType.RUN_SUCCEEDED:
        metrics = data.get("metrics") or {}
        first, last = metrics.get("eval_loss_first"), metrics.get("eval_loss")
        text = f"✅ Run {run} succeeded: eval_loss {first} → {last}\noutput: {data.get('output_dir')}"
        if hub := _url(data.get("hub")):
            text += f"\nhub: {hub}"
        return text + _cost(data)
    if event.type == EventType.SWEEP_STARTED:
        runs = data.get("runs") or []
        return (
            f"🧪 Sweep {data.get('sweep_id')} queued from {data.get('source')}: {len(runs)} runs over "
            f"{', '.join(data.get('keys') or [])}, at most {data.get('max_parallel')} at once"
        )
    if isinstance(event.data, SweepFinished):
        return sweep_text(event.data, CONTENT_MAX)
    if event.type == EventType.WANDB_RUN:
        return f"📈 W&B for run {run}: {data['url']}" if data.get("url") else None
    if event.type == EventType.WANDB_UNAVAILABLE:
        why = truncate(str(data.get("error") or "?"), 300)
        return f"📉 W&B could not be opened for run {run} ({why}): it trains on without W&B"
    if event.type == EventType.INSTANCE_KEPT:
        until = _when(data.get("until"))
        return f"🔧 Instance {data.get('instance')} of run {run} kept for debugging until {until}"
    if event.type == EventType.REAP_TERMINATED:
        return f"🧹 The reaper terminated instance {data.get('instance')} ({data.get('why', '?')})"
    if event.type == EventType.RUN_RETRYING:
        return _retrying(data, run)
    if event.type == EventType.TRAIN_PENDING:
        return _pending(data, run)
    return _node_message(event.type, data, run)


def _retrying(data: dict[str, Any], run: str) -> str | None:
    """A step that failed with an error that may pass: said once per streak (its first failure); the status
    embed shows the count after that, and the run's end says why it gave up."""
    if data.get("attempt") != 1:
        return None
    return (
        f"🔁 Run {run}: its {data.get('stage')} step failed ({data.get('error')}: "
        f"{truncate(str(data.get('why', '?')), 300)}); trying again in {data.get('retry_in_s', 0):g} s, "
        f"until {_when(data.get('gives_up_at'))} at most"
    )


def _pending(data: dict[str, Any], run: str) -> str | None:
    """Ray cannot place the run's training workers: said when the wait starts; the run's failure says the
    rest if it never ends."""
    if data.get("report") != 1 or data.get("gave_up"):
        return None
    limit = data.get("limit_s")
    return (
        f"⏳ Run {run}: Ray cannot place its training workers yet: {data.get('demand')} asked, "
        f"{data.get('why') or '?'}; the cluster has {data.get('cluster') or '?'}. Waiting for nodes"
        + (f" (at most {limit:g} s)" if isinstance(limit, int | float) else "")
    )


def _node_message(kind: EventType, data: dict[str, Any], run: str) -> str | None:
    """Messages about a run's node that someone may have to act on (or pay for)."""
    inst = data.get("instance")
    if kind == EventType.RUN_PREEMPTED:
        return (
            f"⚡ Run {run} lost its node {inst} ({truncate(str(data.get('why', '?')), 300)}) at step "
            f"{data.get('at_step')}: replacing it with {data.get('next_instance')} "
            f"in {data.get('retry_in_s', 0):g} s "
            f"(preemption {data.get('preemption')} of at most {data.get('max_preemptions')})"
        )
    if kind == EventType.INSTANCE_IDLE:
        return (
            f"💤 Instance {inst} of run {run} is idle: it is terminated at {_when(data.get('terminate_at'))}"
        )
    if kind == EventType.INSTANCE_REMINDER:
        until = _when(data.get("until"))
        return f"⏰ Instance {inst} of run {run}, kept for debugging, is terminated at {until}"
    if kind == EventType.INSTANCE_STUCK:
        return (
            f"🚨 Instance {inst} ({data.get('provider_id')}) is still there after {data.get('attempts')} "
            f"terminate calls since {_when(data.get('since'))}, at ${data.get('price_per_hour') or 0:.2f}/h: "
            "check it at the provider and terminate it by hand if this goes on"
        )
    if kind == EventType.INSTANCE_LOST:
        return (
            f"❓ Instance {inst} of run {run} is no longer listed by its provider ({data.get('looks')} looks)"
        )
    if kind == EventType.NODE_JOINED:
        role = "head" if data.get("head") else "worker"
        accelerator = f", {data['accelerator']}" if data.get("accelerator") else ""
        return (
            f"🔗 Run {run}: a Ray {role} node at {data.get('node_ip')} ({data.get('cpus', 0):g} CPUs, "
            f"{data.get('gpus', 0):g} GPUs{accelerator}) joined its cluster: "
            f"{data.get('nodes')} of {data.get('of')} nodes"
        )
    return None


def sweep_text(view: SweepSummary, limit: int) -> str:
    """A sweep's summary and its table (parameters against the metric, the best row starred) in a code
    block, cut to `limit` characters by dropping rows (the best one is always kept)."""
    rows = view.rows
    best = view.best
    headline = f"🧪 Sweep {view.sweep_id} {view.state} · {view.source}"
    if best is not None:
        metric = format_value(best.metric)
        headline += f"\nbest: {best.run_id} ({view.goal} {view.metric}: {metric})"
    shown = list(rows)
    while True:
        lines = table_lines(view.keys, shown, view.metric)
        more = len(rows) - len(shown)
        tail = f"\n… {more} more: fleet status {view.sweep_id}" if more else ""
        text = f"{headline}\n```\n" + "\n".join(lines) + "\n```" + tail
        if len(text) <= limit or not shown:
            return truncate(text, limit)
        cut = next((i for i in range(len(shown) - 1, -1, -1) if not shown[i].best), None)
        if cut is None:
            return truncate(text, limit)
        shown.pop(cut)


def sweep_embed(view: SweepSummary) -> EmbedData:
    """A sweep as an embed: its table in the description."""
    state = view.state
    colour = {"SUCCEEDED": COLOURS[RunState.SUCCEEDED], "FAILED": COLOURS[RunState.FAILED]}.get(
        state, COLOURS[RunState.CANCELLED] if state == "CANCELLED" else RUNNING_COLOUR
    )
    text = sweep_text(view, DESCRIPTION_MAX)
    title, _, description = text.partition("\n")
    return {"title": truncate(title, TITLE_MAX), "description": description, "color": colour}
