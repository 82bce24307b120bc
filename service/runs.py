"""What the CLI and the bot both call: submit, cancel, status. Plain functions over the ledger."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis
from pydantic import JsonValue, SecretStr

from broker import app as broker_app
from broker.dispatch import Dispatcher
from core import redisurl
from core.errors import (
    AlreadyExists,
    ConfigError,
    CredentialsMissing,
    FailureReason,
    FleetError,
    OverBudget,
    Problem,
)
from core.policy_settings import ANY_NAMESPACE, Submitter
from core.settings import Settings
from jobs.sections import CloudSection, ProviderName, rented_clouds
from jobs.shipping import ship_datasets, ship_dir
from jobs.spec import LoadedJob
from jobs.yamlsafe import join_path
from providers.anycloud import pools_to_ask
from providers.base import Provider, Refusal
from providers.world import World
from service.embedded import ensure_redis
from service.hubtoken import push_refusal
from service.pricecap import ceiling_per_hour
from service.wandbkey import wandb_refusal
from state.budget import Ask, held, refusal
from state.ledger import Draft, Ledger
from state.models import Run
from state.payloads import Origin, RunCancelled, RunCancelRequested, RunQueued, submitter_of
from state.stages import RunState, Stage
from state.worstcase import worst_case
from trainer.config import AxolotlConfig
from workers.process import served_queues


@dataclass
class Fleet:
    """A connection to the fleet: its world (settings, secrets, providers: providers.world), Redis, the
    ledger and the dispatcher."""

    world: World
    redis_url: str
    redis: redis.Redis[str]
    ledger: Ledger
    dispatcher: Dispatcher

    @classmethod
    def connect(cls, world: World) -> Fleet:
        """The fleet of `world`: its Redis (the embedded one started if need be), with `world`'s settings,
        secrets as read (never read again) and providers sharing through that Redis."""
        settings = world.settings
        url = settings.redis_url or ensure_redis(settings.home)
        client = redisurl.connect(url, decode_responses=True)
        app = broker_app.configure(settings, url)
        return cls(
            world.sharing(client),
            url,
            client,
            Ledger(client, settings.events_maxlen),
            Dispatcher(app, client, settings.stall_after_s),
        )

    @property
    def settings(self) -> Settings:
        return self.world.settings


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


def _local_elsewhere() -> str:
    """Where a local job can run instead, for a fleet that does not run local jobs."""
    return (
        "; a local job trains on the machine of a fleet that runs its workers there (`fleet run`, "
        f"`fleet up`), or give the job a {' or '.join(f'{c}:' for c in rented_clouds())} section"
    )


def check_submittable(world: World, job: LoadedJob, origin: Origin | None = None) -> None:
    """Refuse (ConfigError) a valid job this fleet cannot run for whoever sent it (`origin`; None: the
    CLI): its provider is not available, or has no credential (named, never shown), or is this machine and
    the sender may not run code here, or it pushes where the sender may not."""
    if job.sweep is not None:
        message = "this file is a sweep: submit it with `fleet sweep FILE` (or /sweep in Discord)"
        raise ConfigError(job.source, [Problem("sweep", message, job.lines.get("sweep"))])
    submitter = submitter_of(origin)
    provider = job.spec.provider.value
    settings, secrets = world.settings, world.secrets
    if isinstance(job.spec.section, CloudSection):
        _check_clouds(world, job, job.spec.section)
    elif provider == "local" and not settings.may_run_here(submitter):
        what = "a local job"
        if provider not in job.lines:
            what = "a job with no provider section (FLEET_DEFAULT_PROVIDER: local)"
        message = (
            f"cannot submit: {what} runs its code on the fleet's own machine, which jobs from "
            f"{submitter.source} may not (FLEET_LOCAL_JOBS_FROM); give the job a "
            f"{', '.join(f'{c}:' for c in rented_clouds())} or {ProviderName.CLOUD}: section"
        )
        raise ConfigError(job.source, [Problem(provider, message, job.lines.get(provider))])
    elif provider not in world.runs:
        message = f"cannot submit: this fleet runs {', '.join(world.runs)} jobs only (FLEET_PROVIDERS)" + (
            _local_elsewhere() if provider == "local" else ""
        )
        raise ConfigError(job.source, [Problem(provider, message, job.lines.get(provider))])
    else:
        try:
            unavailable = world.provider(provider).unavailable()
        except CredentialsMissing as exc:
            raise ConfigError(job.source, [Problem(provider, f"cannot submit: {exc}")]) from None
        if unavailable is not None:
            problem = Problem(provider, f"cannot submit: {unavailable}", job.lines.get(provider))
            raise ConfigError(job.source, [problem])
        _check_refusal(world.provider(provider), job)
    if hub_model_id := job.spec.hub_repo:
        _check_namespace(settings, job, hub_model_id, submitter)
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


def _check_namespace(settings: Settings, job: LoadedJob, repo_id: str, submitter: Submitter) -> None:
    """A job pushes with the fleet's HF token, which may write far more than this job's sender should:
    the namespace must be one the operator grants them (hub_namespaces)."""
    grant = settings.hub_grant(submitter)
    if ANY_NAMESPACE in grant:
        return
    namespace, _, name = repo_id.rpartition("/")
    if namespace and namespace in grant:
        return
    if not grant:
        why = f"jobs from {submitter} may not push to the hub"
    elif not namespace:
        allowed = ", ".join(grant)
        why = f"name the namespace ({grant[0]}/{name}): jobs from {submitter} may push only to {allowed}"
    else:
        why = f"jobs from {submitter} may push only to {', '.join(grant)}, not to {namespace}"
    message = f"cannot submit: {why} (FLEET_HUB_NAMESPACES)"
    raise ConfigError(job.source, [Problem("hub_model_id", message, job.lines.get("hub_model_id"))])


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


def _check_clouds(world: World, job: LoadedJob, section: CloudSection) -> None:
    """A `cloud:` job needs one cloud it allows that this fleet runs and has the credential of, or a pool;
    every pool it names must be one that can run it (a pool of the fleet's that has a machine that fits)."""
    where = "cloud.clouds" if "cloud.clouds" in job.lines else "cloud"
    line = job.lines.get(where)
    if section.pools and (keeps_out := section.pool_refusal()) is not None:
        _refuse(job, Refusal(*keeps_out))
    for owner, pool, why in pools_to_ask(section, world.runs):
        if why is None:
            try:
                refusal = world.provider(owner.value).refusal(section.on_machines(owner, pool))
            except FleetError as exc:
                refusal = Refusal("clouds", str(exc))
            why = refusal.why if refusal is not None else None
        if why is not None:
            raise ConfigError(job.source, [Problem(where, f"cannot submit: {owner}:{pool}: {why}", line)])
    runs = [c for c in section.rented if c.value in world.runs]
    if not runs and not section.pools:
        message = (
            f"cannot submit: none of the clouds the job allows ({', '.join(section.rented)}) is one this "
            f"fleet runs ({', '.join(world.runs)}; FLEET_PROVIDERS)"
        )
        raise ConfigError(job.source, [Problem(where, message, line)])
    missing, refused = [], []
    for cloud in runs:
        try:
            refusal = world.provider(cloud.value).refusal(section)
        except CredentialsMissing as exc:
            missing.append(str(exc).split(":", 1)[0])
            continue
        if refusal is None:
            return
        refused.append((refusal.key, f"{cloud.value}: {refusal.why}"))
    if refused:  # the job's own keys: a cloud could run it, were the fleet set up for them
        _refuse(job, Refusal(refused[0][0], "; ".join(why for _, why in refused)))
    if section.pools:  # its pools can run it
        return
    message = f"cannot submit: the fleet has no credential for any cloud it may use: {'; '.join(missing)}"
    raise ConfigError(job.source, [Problem(where, message, line)])


def _check_refusal(provider: Provider, job: LoadedJob) -> None:
    """Refuse a job its provider cannot run as the fleet is set up (Provider.refusal)."""
    refusal = provider.refusal(job.spec.section)
    if refusal is not None:
        _refuse(job, refusal)


def _refuse(job: LoadedJob, refusal: Refusal) -> None:
    """ConfigError at the section's key that asks what the fleet cannot give."""
    where = join_path(job.spec.provider.value, refusal.key)
    raise ConfigError(job.source, [Problem(where, f"cannot submit: {refusal.why}", job.lines.get(where))])


def _node_shares_files(world: World, provider: ProviderName) -> bool:
    """Whether the node of a job for `provider` reads this machine's files (an unsandboxed local node);
    else the job's files travel to it (a rented node, a sandboxed local one, a `cloud:` job's)."""
    return not provider.is_choice and world.provider(provider.value).shares_files


def check_budget(fleet: Fleet, jobs: Sequence[LoadedJob] = (), origin: Origin | None = None) -> None:
    """Refuse (OverBudget) new runs of `jobs` from whoever sent them (`origin`; None: the CLI) unless their
    worst cases fit under the caps all together: a sweep's children, a batch of files, a commit's configs
    are all queued or none. Each under the per-run cap; with what was spent in the last 24 h and what the
    runs not ended may still cost, under the fleet's day cap and the sender's (state.budget). With no
    jobs: refused only once a cap is spent."""
    settings = fleet.settings
    who = submitter_of(origin)
    cap = settings.max_dollars_per_run
    asks = [Ask(who, worst_case(j.spec, cap, ceiling_per_hour(fleet.world, j.spec)), j.source) for j in jobs]
    why = refusal(settings, held(fleet.ledger, settings), asks)
    if why is not None:
        raise OverBudget(f"cannot submit: {why}")


def submit(
    fleet: Fleet,
    job: LoadedJob,
    *,
    run_id: str | None = None,
    sweep_id: str | None = None,
    params: dict[str, JsonValue] | None = None,
    held: bool = False,
    origin: Origin | None = None,
) -> Run:
    """Record a validated job as a QUEUED run and send it to provision. Nothing is written on error.

    A `held` run (a sweep's child waiting for a slot) is recorded but not sent: its sweep releases it.
    `origin` records where the job came from (a git commit, a Discord user; None: the CLI), which bounds
    what it may do (check_submittable); it must hold no secret.
    """
    spec = job.spec
    check_submittable(fleet.world, job, origin)
    if sweep_id is None:  # a sweep's children were checked together, before the first was written
        check_budget(fleet, [job], origin)
    run_id, run_dir, made = _run_dir(fleet.settings.runs_dir, run_id)
    output_dir = (run_dir / spec.train.output_dir).resolve()
    if run_dir not in output_dir.parents and output_dir != run_dir:
        raise ValueError("output_dir escapes the run directory")  # validated earlier; belt and braces
    try:
        fork = spec.section.axolotl_fork()
        if isinstance(spec.train, AxolotlConfig) and spec.train.axolotl_version is None and fork is None:
            # The run trains with the release the fleet names now, even if the setting changes later.
            pinned = spec.train.model_copy(update={"axolotl_version": fleet.settings.axolotl_version})
            spec = spec.model_copy(update={"train": pinned})
        if spec.provider.is_choice or not _node_shares_files(fleet.world, spec.provider):
            here = spec.provider == ProviderName.LOCAL  # a sandboxed local node reads a local model in place
            shipped = ship_datasets(spec.train, job.source, ship_dir(run_dir), job.paths, node_is_here=here)
            spec = spec.model_copy(update={"train": shipped})
        elif origin is not None and origin.kind == "git" and job.paths and job.paths.trusted:
            # A git job's files are its commit's, in a snapshot removed after submit: copied into the run.
            commit = job.paths.trusted
            shipped = ship_datasets(spec.train, job.source, ship_dir(run_dir), job.paths, from_commit=commit)
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
            ceiling_per_hour=ceiling_per_hour(fleet.world, spec),
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
