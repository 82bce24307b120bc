"""What a job would run, before anything is rented: `fleet validate --plan`.

The plan names the trainer (and why it was chosen), the command the node runs, the node's software (image
or local interpreter, axolotl's release), the machines and GPUs, the training workers, the price per
hour of the cheapest offer that fits now (asked of the provider; a provider that cannot be asked says why)
and the run's worst case: the most it may cost, which the fleet's caps are checked against
(state.worstcase), and whether the per-run cap refuses it.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, ConfigDict

from core.errors import FleetError
from jobs.sections import CloudSection, LocalSection, ProviderName
from jobs.sections.base import MachineSection
from jobs.spec import LoadedJob
from providers.anycloud import providers_of, rank, summary
from providers.base import NodeSoftware
from providers.local.client import axolotl_python, node_python
from providers.offers import Choice
from providers.world import World
from service.pricecap import ceiling_per_hour
from state.worstcase import WorstCase, worst_case
from trainer.config import AxolotlConfig, FleetKeys


class JobPlan(BaseModel):
    """One job's plan, as `fleet validate --plan --json` prints it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    provider: ProviderName
    trainer: str
    trainer_reason: str
    command: str
    """What the node runs for the train stage, as a person would type it."""
    axolotl_version: str | None
    software: str
    """The node's image (rented) or interpreter (local)."""
    gpu: str | None
    gpus_per_node: int
    head: str | None = None
    """The head's own shape (`1 GPU (NVIDIA RTX A4000)`) when it has one; then `gpu` and `gpus_per_node`
    are the other nodes'."""
    nodes: int
    workers: str
    price_per_hour: float | None
    price_note: str
    worst_case_usd: float | None = None
    """The most the run may cost (None: nothing bounds it), as the caps count it."""
    worst_case_note: str = ""
    """How the worst case is reckoned, and what the per-run cap says of it."""

    @property
    def machines(self) -> str:
        """`2 x 4 GPU (NVIDIA L40S)`; with the head's own shape `1 x 1 GPU (...) as the head + 2 x ...`."""
        nodes = self.nodes if self.head is None else self.nodes - 1
        text = f"{nodes} x {self.gpus_per_node} GPU" + (f" ({self.gpu})" if self.gpu else "")
        return text if self.head is None else f"1 x {self.head} as the head + {text}"


def plan_job(world: World, job: LoadedJob) -> JobPlan:
    """The plan of a validated job; asks the job's provider for its offers (never raises FleetError)."""
    settings, spec, train, section = world.settings, job.spec, job.spec.train, job.spec.section
    software = NodeSoftware.of(train, settings.axolotl_version, section.axolotl_fork())
    axolotl = software.trainer == "axolotl"
    local = isinstance(section, LocalSection)
    if local:
        where = str(axolotl_python(settings.axolotl_python) if axolotl else node_python(settings.node_python))
    else:
        where = world.context.image(getattr(section, "image", None), software)
    price, note = _price(world, job, world.runs)
    worst = worst_case(spec, settings.max_dollars_per_run, ceiling_per_hour(world, spec))
    return JobPlan(
        source=job.source,
        provider=spec.provider,
        trainer=train.trainer,
        trainer_reason=job.choice.describe() if job.choice is not None else f"trainer: {train.trainer}",
        command=_command(train),
        axolotl_version=software.axolotl_version,
        software=where,
        gpu=None if local else _gpu(section),
        gpus_per_node=spec.gpu_count,
        head=_head(section),
        nodes=section.num_nodes,
        workers=_workers(train, spec.gpu_count),
        price_per_hour=price,
        price_note=note,
        worst_case_usd=worst.dollars if worst.bounded else None,
        worst_case_note=_worst_note(worst, settings.max_dollars_per_run),
    )


def _worst_note(worst: WorstCase, cap: float | None) -> str:
    """How the worst case comes about, and whether the per-run cap (FLEET_MAX_DOLLARS_PER_RUN) lets it run."""
    if worst.hours is None:  # free, or bounded by the cap itself (its `how` says so)
        return worst.how
    if cap is None:
        return f"{worst.how}; no per-run cap"
    if worst.dollars > cap:
        return (
            f"{worst.how}: over the cap of ${cap:.2f} a run (FLEET_MAX_DOLLARS_PER_RUN), so refused at "
            "submit; shorten terminate_after, lower max_bid_per_gpu or the GPUs"
        )
    return f"{worst.how}; within the cap of ${cap:.2f} a run"


def _gpu(section: object) -> str | None:
    return section.gpu_named() if isinstance(section, MachineSection) else None


def _head(section: object) -> str | None:
    """The head's own shape, when the section gives it one."""
    if not isinstance(section, MachineSection) or not section.has_own_head:
        return None
    head = section.node_section(0)
    return f"{head.gpu_count} GPU ({head.gpu_named()})" if head.gpu_count else "no GPU"


def _command(train: FleetKeys) -> str:
    if isinstance(train, AxolotlConfig):
        return "axolotl train job.yml" + (" --use-ray" if train.use_ray else "")
    return "python -m trainer train (the builtin LoRA recipe)"


def _workers(train: FleetKeys, gpus: int) -> str:
    axolotl = isinstance(train, AxolotlConfig)
    if train.use_ray:  # axolotl's launcher takes a GPU per worker unless told otherwise
        default = {"GPU": 1} if gpus or axolotl else {"CPU": 1}
        return f"{train.ray_num_workers} Ray Train workers, {train.resources_per_worker or default} each"
    if axolotl and gpus > 1:
        return f"{gpus} processes (accelerate, one per GPU)"
    return "1 process"


def _price(
    world: World, job: LoadedJob, fleet_runs: Collection[str] | None = None
) -> tuple[float | None, str]:
    """The cheapest fitting offers' price for the whole cluster (the head's own shape priced apart), and a
    note on where it came from."""
    spec = job.spec
    if isinstance(spec.section, LocalSection):
        return 0.0, "this machine"
    if isinstance(spec.section, CloudSection):
        ranked = rank(spec.section, providers_of(world.provider), fleet_runs)
        if not ranked.fits:
            return None, f"no offer fits now: {summary(ranked)} (`fleet offers FILE` says why)"
        best = ranked.fits[0]
        which = "a named pool's machine" if best.cloud in {o for o, _ in spec.section.pools} else "cheapest"
        note = f"{which} of {len(ranked.fits)} fitting offer(s), any cloud: {best.gpu} on {best.cloud}"
        return best.priced.price_per_hour, note
    nodes = spec.section.num_nodes
    head = spec.section.node_section(0)
    shapes = [(head, 1), (spec.section, nodes - 1)] if spec.section.has_own_head else [(spec.section, nodes)]
    try:
        chooser = getattr(world.provider(spec.provider.value), "choose", None)
    except FleetError as exc:
        return None, f"offers unknown: {exc}"
    total, notes = 0.0, []
    for section, count in shapes:
        try:
            choice: Choice | None = chooser(section) if chooser is not None else None
        except FleetError as exc:
            return None, f"offers unknown: {exc}"
        if choice is None or choice.best is None:
            return None, "no offer fits now (`fleet offers FILE` says why)"
        total += choice.best.price_per_hour * count
        shown = f"{choice.best.candidate.gpu}" + (f", x{count} nodes" if count > 1 else "")
        if len(shapes) > 1:
            shown = ("the head: " if section is head else "the others: ") + shown
        notes.append(f"cheapest of {len(choice.fits)} fitting offer(s): {shown}")
    return total, "; ".join(notes)
