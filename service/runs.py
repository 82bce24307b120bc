"""What the CLI and the bot both call: submit, cancel, status. Plain functions over the ledger."""

from __future__ import annotations

import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import JsonValue, SecretStr

from broker import app as broker_app
from broker.constants import Stage
from broker.cost import DAY_S, fleet_cost
from broker.dispatch import Dispatcher
from broker.ledger import Draft, Ledger
from broker.models import Run, RunState
from broker.payloads import GitOrigin, RunCancelled, RunCancelRequested, RunQueued
from core import redisurl
from core.errors import AlreadyExists, ConfigError, CredentialsMissing, FailureReason, OverBudget, Problem
from core.secrets import Secrets
from core.settings import Settings
from jobs.sections import CloudSection
from jobs.shipping import ship_datasets, ship_dir
from jobs.spec import LoadedJob
from providers.base import ProviderContext
from providers.registry import PROVIDERS, get_provider, load_fleet_secrets, provider_context, shared_context
from service.embedded import ensure_redis
from service.hubtoken import push_refusal
from service.wandbkey import wandb_refusal
from trainer.config import AxolotlConfig
from workers.process import served_queues


@dataclass
class Fleet:
    """A connection to the fleet: settings, Redis, the ledger and the dispatcher."""

    settings: Settings
    redis_url: str
    redis: redis.Redis[str]
    ledger: Ledger
    dispatcher: Dispatcher

    @classmethod
    def connect(cls, settings: Settings) -> Fleet:
        url = settings.redis_url or ensure_redis(settings.home)
        client = redisurl.connect(url, decode_responses=True)
        app = broker_app.configure(settings, url)
        return cls(
            settings,
            url,
            client,
            Ledger(client, settings.events_maxlen),
            Dispatcher(app, client, settings.stall_after_s),
        )

    def provider_context(self) -> ProviderContext:
        """What providers get in this process: with the lists and the nodes' tokens the fleet shares."""
        return shared_context(self.settings, self.redis)


ID_DRAWS = 50


def new_run_id() -> str:
    """Sortable and readable: yymmdd-hhmmss-xxxxxx (24 random bits; a taken one is drawn again)."""
    return time.strftime("%y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _run_dir(runs_dir: Path, run_id: str | None) -> tuple[str, Path, bool]:
    """The run's id, its directory, and whether it was made here (then a failed submit removes it). A
    fresh id is drawn until its directory did not exist (made exclusively: two submits in one second never
    share one; the ledger refuses a taken id too); a given id (a sweep's child, a commit's run) keeps a
    directory it has."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(1 if run_id is not None else ID_DRAWS):
        chosen = run_id or new_run_id()
        try:
            (runs_dir / chosen).mkdir()
        except FileExistsError:
            if run_id is not None:
                return run_id, (runs_dir / run_id).resolve(), False
            continue
        return chosen, (runs_dir / chosen).resolve(), True
    raise AlreadyExists(f"no free run id after {ID_DRAWS} draws")


LOCAL_ELSEWHERE = (
    "; a local job trains on the machine of a fleet that runs its workers there (`fleet run`, `fleet up`), "
    "or give the job a runpod: or vastai: section"
)


def check_submittable(settings: Settings, job: LoadedJob) -> None:
    """Refuse (ConfigError) a valid job this fleet cannot run: its provider is not available, or has no
    credential (named, never shown)."""
    if job.sweep is not None:
        message = "this file is a sweep: submit it with `fleet sweep FILE` (or /sweep in Discord)"
        raise ConfigError(job.source, [Problem("sweep", message, job.lines.get("sweep"))])
    provider = job.spec.provider.value
    secrets = load_fleet_secrets()
    if isinstance(job.spec.section, CloudSection):
        _check_clouds(settings, job, job.spec.section, secrets)
    elif provider not in settings.providers:
        message = (
            f"cannot submit: this fleet runs {', '.join(settings.providers)} jobs only (FLEET_PROVIDERS)"
            + (LOCAL_ELSEWHERE if provider == "local" else "")
        )
        raise ConfigError(job.source, [Problem(provider, message, job.lines.get(provider))])
    else:
        try:
            get_provider(provider, provider_context(settings, secrets))
        except CredentialsMissing as exc:
            raise ConfigError(job.source, [Problem(provider, f"cannot submit: {exc}")]) from None
    if hub_model_id := job.spec.train.hub_model_id:
        _check_push(settings, job, hub_model_id, secrets.get("HF_TOKEN"))
    train = job.spec.train
    online = (train.wandb_mode or settings.wandb_mode) == "online"
    if train.wandb_project and online:
        _check_wandb(settings, job, secrets.get("WANDB_API_KEY"))


def _check_wandb(settings: Settings, job: LoadedJob, key: SecretStr | None) -> None:
    """An online W&B run needs WANDB_API_KEY, and one W&B takes for the job's entity (service.wandbkey)."""
    if key is None:
        message = (
            "cannot submit: W&B online needs WANDB_API_KEY in the environment or the fleet's secrets file "
            "(or set wandb_mode: offline / disabled)"
        )
        raise ConfigError(job.source, [Problem("wandb_project", message, job.lines.get("wandb_project"))])
    entity = job.spec.train.wandb_entity or settings.wandb_entity
    refused = wandb_refusal(settings.wandb_base_url, key, entity)
    if refused is not None:
        # The entity's key when the job names it (else WANDB_ENTITY's, a fleet setting: the job's project).
        where = "wandb_entity" if refused.entity and job.spec.train.wandb_entity else "wandb_project"
        raise ConfigError(job.source, [Problem(where, f"cannot submit: {refused.why}", job.lines.get(where))])


def _check_push(settings: Settings, job: LoadedJob, repo_id: str, token: SecretStr | None) -> None:
    """A job that pushes needs HF_TOKEN, and one the Hub says may write there (service.hubtoken)."""
    line = job.lines.get("hub_model_id")
    if token is None:
        message = (
            "cannot submit: pushing to the hub needs HF_TOKEN (a write token) in the environment or in the "
            "fleet's secrets file (mode 600), never in a job file"
        )
        raise ConfigError(job.source, [Problem("hub_model_id", message, line)])
    why = push_refusal(settings.hf_endpoint, token, repo_id)
    if why is not None:
        raise ConfigError(job.source, [Problem("hub_model_id", f"cannot submit: {why}", line)])


def _check_clouds(settings: Settings, job: LoadedJob, section: CloudSection, secrets: Secrets) -> None:
    """A `cloud:` job needs one cloud it allows that this fleet runs and has the credential of."""
    where = "cloud.clouds" if "cloud.clouds" in job.lines else "cloud"
    line = job.lines.get(where)
    runs = [c for c in section.clouds if c.value in settings.providers]
    if not runs:
        message = (
            f"cannot submit: none of the clouds the job allows ({', '.join(section.clouds)}) is one this "
            f"fleet runs ({', '.join(settings.providers)}; FLEET_PROVIDERS)"
        )
        raise ConfigError(job.source, [Problem(where, message, line)])
    missing = []
    for cloud in runs:
        try:
            get_provider(cloud.value, provider_context(settings, secrets))
            return
        except CredentialsMissing as exc:
            missing.append(str(exc).split(":", 1)[0])
    message = f"cannot submit: the fleet has no credential for any cloud it may use: {'; '.join(missing)}"
    raise ConfigError(job.source, [Problem(where, message, line)])


def check_budget(fleet: Fleet) -> None:
    """Refuse (OverBudget) a new run while the fleet's nodes cost `max_dollars_per_day` in the last 24 h."""
    cap = fleet.settings.max_dollars_per_day
    if cap is None:
        return
    spent = fleet_cost(fleet.ledger, since=time.time() - DAY_S)
    if spent >= cap:
        raise OverBudget(
            f"cannot submit: the fleet's nodes cost ${spent:.2f} in the last 24 h; the cap is ${cap:.2f} "
            "a day (FLEET_MAX_DOLLARS_PER_DAY)"
        )


def submit(
    fleet: Fleet,
    job: LoadedJob,
    *,
    run_id: str | None = None,
    sweep_id: str | None = None,
    params: dict[str, JsonValue] | None = None,
    held: bool = False,
    origin: GitOrigin | None = None,
) -> Run:
    """Record a validated job as a QUEUED run and send it to provision. Nothing is written on error.

    A `held` run (a sweep's child waiting for a slot) is recorded but not sent: its sweep releases it.
    `origin` records where the job came from (a git commit); it must hold no secret.
    """
    spec = job.spec
    check_submittable(fleet.settings, job)
    check_budget(fleet)
    run_id, run_dir, made = _run_dir(fleet.settings.runs_dir, run_id)
    output_dir = (run_dir / spec.train.output_dir).resolve()
    if run_dir not in output_dir.parents and output_dir != run_dir:
        raise ValueError("output_dir escapes the run directory")  # validated earlier; belt and braces
    try:
        if isinstance(spec.train, AxolotlConfig) and spec.train.axolotl_version is None:
            # The run trains with the release the fleet names now, even if the setting changes later.
            pinned = spec.train.model_copy(update={"axolotl_version": fleet.settings.axolotl_version})
            spec = spec.model_copy(update={"train": pinned})
        if spec.provider.is_choice or not PROVIDERS[spec.provider].shares_files:  # `cloud:`: a rented node
            shipped = ship_datasets(spec.train, job.source, ship_dir(run_dir), job.paths)
            spec = spec.model_copy(update={"train": shipped})
        run = Run(
            run_id=run_id,
            provider=spec.provider,
            source=job.source,
            spec=spec,
            run_dir=str(run_dir),
            output_dir=str(output_dir),
            sweep_id=sweep_id,
            params=params or {},
            held=held,
            origin=origin,
        )
        (run_dir / "job.yml").write_text(job.text, encoding="utf-8")
        extra: dict[str, object] = {}
        if sweep_id is not None:
            extra.update(sweep_id=sweep_id, params=run.params, held=held)
        if origin:
            extra.update(origin=origin)
        queued = RunQueued(source=job.source, provider=run.provider, warnings=job.warnings, **extra)
        drafts: list[Draft] = [queued]
        fleet.ledger.create_run(run, drafts)
    except BaseException:
        if made:  # never another run's directory
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if not held:
        fleet.dispatcher.send(Stage.PROVISION, run_id, after=None)
    return run


def cancel(fleet: Fleet, run_id: str) -> Run:
    """Ask a run to stop. The stage that owns it stops the Ray job, terminates the node, ends it CANCELLED.
    A run still queued while no worker serves provision (so no node was asked for) ends CANCELLED at once."""
    run = fleet.ledger.find_run(run_id)
    if run.state.is_terminal():
        return run

    def flag(r: Run) -> list[Draft]:
        if r.cancel_requested or r.state.is_terminal():
            return []
        r.cancel_requested = True
        return [RunCancelRequested(state=r.state.value)]

    run = fleet.ledger.update_run(run.run_id, flag)
    if run.state == RunState.QUEUED and run.instance is None and not serves(fleet, Stage.PROVISION):
        return _end_queued(fleet, run.run_id)
    if (stage := run.state.stage) is not None:
        # Its stage's task now, unless a task owns the run (it sees the flag before its next step); a run
        # parked on its node is woken from the watcher.
        fleet.dispatcher.send(stage, run.run_id, after=None) or fleet.dispatcher.wake(stage, run.run_id)
    return run


def serves(fleet: Fleet, stage: Stage) -> bool:
    """Whether a live worker consumes `stage`'s queue (by the workers' heartbeat keys)."""
    return stage.value in served_queues(fleet.redis)


def _end_queued(fleet: Fleet, run_id: str) -> Run:
    """End a queued run no worker has taken: no task owns it and no node was asked for, so nothing is left
    to stop. A provision task that comes for it later finds it ended and stands down."""
    why = "cancelled while queued: no worker had taken it, no node was asked for"

    def end(r: Run) -> list[Draft]:
        if r.state != RunState.QUEUED or r.instance is not None:
            return []
        r.state, r.failure_reason, r.failure_message = (
            RunState.CANCELLED,
            FailureReason.CANCELLED_BY_USER,
            why,
        )
        return [RunCancelled(reason=FailureReason.CANCELLED_BY_USER, message=why, cost_usd=0.0)]

    return fleet.ledger.update_run(run_id, end)
