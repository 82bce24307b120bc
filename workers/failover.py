"""A `cloud:` job's offers, one per attempt. Provision asks here which cloud and offer an attempt rents: the
cheapest fit across the clouds the job allows (providers.anycloud) that the run has not tried yet. When a
create finds no capacity, or the node is not ready in time, the run moves on: what the attempt made is
terminated, the next attempt (its own instance names, tf-<run>-<attempt>, and the same lookup before any
create) gets the next offer, and an event says why the last was left. After `max_attempts` offers, or with
nothing left that fits, the run fails NO_CAPACITY naming each offer it tried and why it left it. A pool's
machine (`clouds: [ssh:lab, ...]`) is an offer like a rental's, tried first; one another run claimed
meanwhile is left like an offer with no capacity. When nothing is left to rent but a pool whose machines
are all held now, the run waits for one (MachinesHeld: provision waits without counting a retry)."""

from __future__ import annotations

import logging

from core.errors import RETRYABLE, FailureReason, FleetError, MachinesHeld, StageFailed
from jobs.sections import CloudSection
from providers.anycloud import CloudChoice, providers_of, rank, summary
from state.ledger import Draft
from state.models import InstanceState, Placement, Run
from state.payloads import OfferChosen, OfferLeft
from workers import context
from workers.ending import terminate_instance

log = logging.getLogger("trainfleet.workers")


def _section(run: Run) -> CloudSection:
    section = run.spec.section
    assert isinstance(section, CloudSection)
    return section


def tried(run: Run) -> dict[str, str]:
    """The offers the run has left, and why: {cloud:offer (gpu): why}."""
    return {f"{p.key} ({p.gpu})": p.left for p in run.progress.placements if p.left is not None}


def offers(ctx: context.Context, section: CloudSection) -> CloudChoice:
    """The section's offers on every cloud it allows, through this worker's providers."""
    return rank(section, providers_of(ctx.provider), ctx.world.runs)


def place(ctx: context.Context, run: Run) -> Run:
    """The run with this attempt's offer chosen and recorded, and its provider that offer's cloud (as it
    was, when it has one). Raises StageFailed NO_CAPACITY when the attempts are spent or nothing (left)
    fits; a cloud's error that may pass when no cloud had anything to offer (the stage retries)."""
    if run.placement is not None:
        return run
    section = _section(run)
    left = tried(run)  # the offers the run moved on from; a node preempted under it is no reason to avoid one
    if len(left) >= section.max_attempts:
        said = "; ".join(f"{key}: {why}" for key, why in left.items())
        raise StageFailed(
            FailureReason.NO_CAPACITY, f"{section.max_attempts} offer(s) tried (max_attempts): {said}"
        )
    choice = offers(ctx, section)
    best = choice.best(p.key for p in run.progress.placements if p.left is not None)
    if best is None:
        passing = [e for e in choice.errors if isinstance(e, RETRYABLE)]
        if passing and not choice.fits:
            raise passing[0]  # a cloud did not answer, and none had anything: ask again later
        if choice.held:  # nothing (left) to rent, and a pool's machines are held: wait for one
            pools = ", ".join(choice.held)
            raise MachinesHeld(
                f"every machine of {pools} that fits is held by another run, and nothing else fits"
            )
        raise StageFailed(FailureReason.NO_CAPACITY, f"no offer (left) fits: {summary(choice, left)}")
    c = best.priced.candidate
    placement = Placement(
        attempt=run.attempt,
        cloud=best.cloud,
        offer=c.offer_id,
        gpu=best.gpu,
        vendor_gpu=best.vendor_gpu,
        secure=c.secure,
        price_per_hour=best.priced.price_per_hour,
    )

    def put(r: Run) -> list[Draft]:
        if r.placement is not None or r.attempt != placement.attempt or r.state.is_terminal():
            return []  # another task chose meanwhile, or the run moved on or ended
        r.progress.placements = [*r.progress.placements, placement]
        r.provider = placement.cloud
        unasked = [f"{cloud}: {why}" for cloud, why in choice.unasked]
        return [
            OfferChosen(
                attempt=placement.attempt,
                cloud=placement.cloud,
                gpu=placement.gpu,
                offer=placement.offer,
                price_per_hour=placement.price_per_hour,
                fits=len(choice.fits),
                unasked=unasked,
            )
        ]

    return ctx.ledger.update_run(run.run_id, put)


def move_on(ctx: context.Context, run: Run, why: str) -> None:
    """Leave this attempt's offer: terminate what it made (the reaper retries a terminate that fails: the
    instance is TERMINATING), record why, and start the next attempt, whose offer `place` chooses."""
    placed = run.placement
    assert placed is not None
    for name in run.instance_names:
        record = ctx.ledger.get_instance(name)
        if record is not None and record.state == InstanceState.REQUESTED and record.create_called_at is None:
            # No create call went out that could have made it (none yet, or a clear no): nothing to end.
            ctx.ledger.update_instance(name, state=InstanceState.TERMINATED, why_terminated=why[:300])
    try:
        drafts = terminate_instance(ctx, run)
    except FleetError as exc:
        log.warning("run %s: ending attempt %d's node: %s (the reaper retries)", run.run_id, run.attempt, exc)
        drafts = []

    def onward(r: Run) -> list[Draft]:
        last = r.placement
        if last is None or last.attempt != placed.attempt or r.state.is_terminal():
            return []  # moved on already, or ended
        r.progress.placements = [*r.progress.placements[:-1], last.model_copy(update={"left": why[:300]})]
        name = r.instance_name
        r.attempt += 1
        r.instance, r.ray_jobs, r.log_offset = None, {}, 0
        r.progress.cluster = []
        left = OfferLeft(
            attempt=last.attempt,
            cloud=last.cloud,
            gpu=last.gpu,
            offer=last.offer,
            why=why[:300],
            instance=name,
        )
        return [*drafts, left]

    ctx.ledger.update_run(run.run_id, onward)
