"""What a stage sends to the run's node: the TrainJob (no secrets), its Ray jobs' environment and files, the
credentials the node gets at start, and a client for its Ray head."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from core import envnames
from core.errors import ConfigError, Problem
from jobs import shipping
from jobs.redact import redact_job, redact_values
from jobs.secretscan import redacted
from jobs.sections import MachineSection
from providers.base import NodeEndpoint, NodeSoftware
from providers.node import JobInfo, NodeClient, NodeTimeouts
from state import nodelogs
from state.ledger import Draft
from state.models import Run
from state.payloads import PAYLOADS, EventType, Payload, RunRetrying
from trainer import progress, verbosity
from trainer.config import AnyTrainConfig, TrainJob, as_jsonable
from workers import context, wandb_plan

log = logging.getLogger("trainfleet.workers")
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception): ")


def train_job(ctx: context.Context, run: Run) -> TrainJob:
    """What the node gets: the training config and where to put things (no secrets). A node that shares
    this machine's files uses the run's own directories; a rented one gets paths under its own root."""
    spec = run.spec
    if ctx.provider(run.provider).shares_files:
        dirs = {
            "work_dir": run.run_dir,
            "output_dir": run.output_dir,
            "cache_dir": str(ctx.settings.cache_dir),
        }
    else:
        work = f"runs/{run.run_id}"
        output = Path(run.output_dir).relative_to(run.run_dir).as_posix()
        cache = ctx.provider(run.provider).node_cache_dir or "cache"
        dirs = {"work_dir": work, "output_dir": f"{work}/{output}", "cache_dir": cache}
    section = spec.section
    return TrainJob(
        run_id=run.run_id,
        config=without_secrets(spec.train, run.source),
        use_gpu=spec.gpu_count > 0,
        job_yaml=shown_job(ctx, run),
        wandb=wandb_plan.for_trainer(ctx, run),
        prepare_only=section.prepare_ds_only,
        log_eval=section.log_eval,
        debug=section.debug,
        deepspeed=isinstance(section, MachineSection) and section.deepspeed,
        **dirs,
    )


def without_secrets(config: AnyTrainConfig, source: str) -> AnyTrainConfig:
    """The training config with every secret-looking value blanked (jobs.secretscan.redacted): what the
    node's Ray jobs carry in their runtime_env (which Ray logs) and the trainer writes to W&B. A job
    validated since job files refuse such values has none; one submitted before may. ConfigError (naming
    the keys, never the values) when a typed key cannot hold the blank."""
    data = as_jsonable(config)
    clean = redacted(data)
    if clean == data:
        return config
    try:
        return type(config).model_validate(clean)
    except ValidationError as exc:
        keys = sorted({".".join(map(str, err["loc"])) for err in exc.errors()})
        why = "holds a secret-looking value; take it out of the job file and submit it again"
        raise ConfigError(source, [Problem(key, why) for key in keys]) from None


def node_software(ctx: context.Context, run: Run) -> NodeSoftware:
    """What the run's nodes must run: axolotl at the run's release (pinned at submit), or the section's fork
    at the commit its first node installed (once the readiness check said which), or the builtin's."""
    fork, commit = run.spec.section.axolotl_fork(), run.progress.axolotl_commit
    return NodeSoftware.of(run.spec.train, ctx.settings.axolotl_version, fork, commit)


def shown_job(ctx: context.Context, run: Run) -> str | None:
    """The run's job file as a model card may show it (jobs.redact), or None when it is not at hand."""
    try:
        text = (Path(run.run_dir) / "job.yml").read_text(encoding="utf-8")
    except OSError:
        return None
    return redact_job(text, known_secrets(ctx))


def known_secrets(ctx: context.Context) -> list[str]:
    """The values of the fleet's credentials: what must never leave in a text from the node (jobs.redact)."""
    return [v.get_secret_value() for v in ctx.provider_context.credentials.values()]


def node_env(ctx: context.Context, run: Run) -> dict[str, str]:
    """The environment of each of the run's Ray jobs: the TrainJob, where the hub and W&B are, a drill's
    fault injection, and the libraries' debug switches when the section asks (`debug`). No secrets."""
    env = {progress.ENV_VAR: train_job(ctx, run).to_env(), "HF_ENDPOINT": ctx.settings.hf_endpoint}
    if ctx.settings.hf_hub_disable_xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    if run.progress.wandb is not None:  # where the trainer writes the W&B run (a W&B Server's, a fake's)
        env["WANDB_BASE_URL"] = ctx.settings.wandb_base_url
    if ctx.settings.fault_injection:  # a drill the fleet's operator asked for (a job file cannot)
        env[envnames.FAULT_INJECTION] = ctx.settings.fault_injection
    if run.spec.section.debug:
        env.update(verbosity.DEBUG_ENV)
    return env


def files_for_node(ctx: context.Context, run: Run) -> Path | None:
    """The directory that travels with the run's Ray jobs as their working_dir (None: the node shares
    this machine's files)."""
    if ctx.provider(run.provider).shares_files:
        return None
    files = shipping.ship_dir(run.run_dir)
    return files if files.is_dir() else None


def node(ctx: context.Context, run: Run) -> NodeClient:
    """The client of the run's head: at the address the ledger keeps since provision found it (no provider
    call), else looked up."""
    assert run.instance is not None
    return NodeClient(head_endpoint(ctx, run.provider, run.instance), NodeTimeouts.of(ctx.settings))


def head_endpoint(ctx: context.Context, provider: str, name: str) -> NodeEndpoint:
    """Where instance `name`'s Ray head is: the ledger's address for it, else the provider's lookup."""
    record = ctx.ledger.get_instance(name)
    return ctx.provider(provider).endpoint_at(name, record.dashboard_url if record is not None else None)


def submit_once(
    ctx: context.Context,
    run: Run,
    client: NodeClient,
    key: str,
    sid: str,
    submit: Callable[[], None],
    first: Sequence[Draft],
) -> JobInfo | None:
    """The Ray job `sid` of the run (one per attempt), submitted once: `submit()` sends it, its id is
    recorded under `run.ray_jobs[key]` with the events `first` (once, whatever tasks race), and it is sent
    again when the node no longer knows it (its head started again). Its info; None when it was just sent
    again (ask at the next poll)."""
    if run.ray_jobs.get(key) != sid:
        submit()

        def submitted(r: Run) -> list[Draft]:
            if r.ray_jobs.get(key) == sid:
                return []
            r.ray_jobs[key] = sid
            return list(first)

        ctx.ledger.update_run(run.run_id, submitted)
    info = client.info(sid)
    if info is None:
        submit()
    elif resend(ctx, run, client, sid, info, submit):
        return None
    return info


def job_log(ctx: context.Context, run: Run, client: NodeClient, sid: str) -> str:
    """The output of the run's ended Ray job `sid`, kept (redacted) for `fleet logs --node`."""
    text = client.logs(sid)
    nodelogs.put(ctx.redis, run.run_id, sid, redact_values(text, known_secrets(ctx)))
    return text


def keep_log(ctx: context.Context, run: Run, sid: str, lines: str) -> None:
    """Keep (redacted) new whole lines of a running job's output for `fleet logs --node`."""
    nodelogs.append(ctx.redis, run.run_id, sid, redact_values(lines, known_secrets(ctx)))


def resend(
    ctx: context.Context, run: Run, client: NodeClient, sid: str, info: JobInfo, submit: Callable[[], None]
) -> bool:
    """Send the Ray job `sid` again when Ray failed it before its command started (it could not set up
    its runtime environment: a package that did not come out of the head's store, an agent too busy to
    answer), once: it is forgotten on the node and sent again under the same id, with a `run.retrying`
    event. False when it ran, or was sent again already (a second such failure is the job's own)."""
    if not info.never_ran or sid in run.resent:
        return False
    stage = run.state.stage
    assert stage is not None, f"run {run.run_id} sends Ray jobs outside a stage"
    retrying = RunRetrying(
        stage=stage,
        attempt=1,
        max_failures=2,
        error="RuntimeEnvSetupError",
        why=f"Ray job {sid} never ran: {raised(redact_values(info.message, known_secrets(ctx)))}"[:500],
        retry_in_s=0.0,
        gives_up_at=round(time.time(), 3),
    )

    def once(r: Run) -> list[Draft]:
        if sid in r.resent:
            return []
        r.resent.append(sid)
        return [retrying]

    ctx.ledger.update_run(run.run_id, once)
    log.warning("run %s: Ray job %s never ran (its runtime environment failed): sent again", run.run_id, sid)
    client.delete(sid)
    submit()
    return True


def raised(message: str) -> str:
    """The last exception a traceback in `message` names (`OSError: ...`), else the whole message."""
    found = [line for line in message.splitlines() if EXCEPTION_LINE.match(line)]
    return found[-1] if found else message


def node_record(event: EventType, record: Mapping[str, Any]) -> Payload | None:
    """One of the trainer's progress lines as the payload of `event`; None (and a warning in the log) when
    it does not fit, so a malformed line from the node is dropped as a garbled one is."""
    try:
        return PAYLOADS[event].model_validate({k: v for k, v in record.items() if k != "kind"})
    except ValidationError as exc:
        log.warning("a %s line from the node does not fit its event: %s", event.value, exc)
        return None
