"""`fleet offers FILE`: what the job's section could rent now, cheapest first, and why the rest does not fit.
A `cloud:` job's offers come from every cloud it allows, side by side with their cloud, and the clouds not
asked say why (no credential, not run by this fleet, `avoid` where a cloud does not say where it is)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from core.errors import ConfigError, FleetError
from fleet.cli_common import JsonOpt, err, out, world_or_exit
from jobs.gpus import known_names
from jobs.sections import CloudSection
from jobs.spec import format_problems, load_job
from providers.anycloud import CloudChoice, providers_of, rank
from providers.offers import HELD_BY, Choice

Row = dict[str, Any]


def register(cli: typer.Typer) -> None:
    """Add the command to the `fleet` app."""
    cli.command()(offers)


def offers(
    file: Annotated[Path, typer.Argument(help="A job YAML file.")],
    head: Annotated[
        bool, typer.Option("--head", help="The offers for the head's own shape (`head:` in a cluster).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The offers that fit the job's provider section, cheapest first, and why the others do not (a
    `cloud:` job: every cloud's, with their cloud)."""
    world = world_or_exit()
    settings = world.settings
    unasked: list[Row] = []
    try:
        job = load_job(file, default_provider=settings.default_provider, data_roots=settings.data_roots)
        section = job.spec.section.node_section(0) if head else job.spec.section
        if isinstance(section, CloudSection):
            ranked = rank(section, providers_of(world.provider), world.runs)
            fits, rejected, unasked = _cloud_rows(ranked)
        else:
            provider = world.provider(job.spec.provider.value)
            chooser = getattr(provider, "choose", None)
            choice: Choice | None = chooser(section) if chooser is not None else None
            if choice is None:
                plain = provider.list_offers(section)
                fits = [
                    _row(o.provider.value, o.offer_id, o.gpu, o.gpu_count, o.price_per_hour)
                    for o in plain
                    if HELD_BY not in o.detail
                ]
                rejected = [
                    {
                        "cloud": o.provider.value,
                        "offer": o.offer_id,
                        "why": [f"held by run {o.detail[HELD_BY]}"],
                    }
                    for o in plain
                    if HELD_BY in o.detail
                ]
            else:
                fits, rejected = _rows(choice)
    except ConfigError as exc:
        err.print(format_problems(exc), markup=False, highlight=False)
        raise typer.Exit(1) from None
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if not head and job.spec.section.has_own_head:
        err.print(f"the head has its own shape: fleet offers {file} --head", markup=False, highlight=False)
    if as_json:
        shown = {"provider": job.spec.provider.value, "fits": fits, "rejected": rejected}
        out.print_json(
            json.dumps(shown | ({"unasked": unasked} if isinstance(section, CloudSection) else {}))
        )
        return
    _print(fits, rejected, unasked, cloud=isinstance(section, CloudSection))


def _row(cloud: str, offer: str, gpu: str | None, count: int, price: float, bid: float | None = None) -> Row:
    return {"cloud": cloud, "offer": offer, "gpu": gpu, "gpu_count": count, "price_per_hour": price} | {
        "bid_per_gpu": bid
    }


def _rows(choice: Choice) -> tuple[list[Row], list[Row]]:
    fits = [
        _row(p.candidate.provider.value, p.candidate.offer_id, p.candidate.gpu, p.candidate.gpu_count,
             p.price_per_hour, p.bid_per_gpu)
        for p in choice.fits
    ]  # fmt: skip
    rejected = [
        {"cloud": r.candidate.provider.value, "offer": r.candidate.offer_id, "why": list(r.reasons)}
        for r in choice.rejected
    ]
    return fits, rejected


def _cloud_rows(choice: CloudChoice) -> tuple[list[Row], list[Row], list[Row]]:
    fits = []
    for o in choice.fits:
        c = o.priced.candidate
        row = _row(
            o.cloud.value, c.offer_id, o.gpu, c.gpu_count, o.priced.price_per_hour, o.priced.bid_per_gpu
        )
        fits.append(row | {"vendor_gpu": o.vendor_gpu, "location": c.detail.get("location")})
    _, rejected = _rows(Choice((), choice.rejected))
    unasked = [{"cloud": cloud, "why": why} for cloud, why in choice.unasked]
    return fits, rejected, unasked


def _print(fits: list[Row], rejected: list[Row], unasked: list[Row], cloud: bool) -> None:
    columns = (["cloud"] if cloud else []) + ["offer", "gpu", "GPUs", "$/h", "bid $/GPU/h"]
    title = "fits: named pools' machines first, then the cheapest" if cloud else "fits, cheapest first"
    table = Table(*columns, title=title)
    for f in fits:
        bid = f.get("bid_per_gpu")
        cells = [str(f["offer"]), str(f["gpu"]), str(f["gpu_count"]), f"{f['price_per_hour']:.3f}"]
        cells.append("-" if bid is None else f"{bid:.3f}")
        table.add_row(*([str(f["cloud"])] if cloud else []), *cells)
    out.print(table)
    if rejected:
        left = Table(*(["cloud"] if cloud else []), "offer", "why not", title="left out")
        for r in rejected:
            left.add_row(*([str(r["cloud"])] if cloud else []), str(r["offer"]), "; ".join(r["why"]))
        out.print(left)
    for u in unasked:
        err.print(f"{u['cloud']} not asked: {u['why']}", markup=False, highlight=False)
    if cloud and not fits:
        err.print(
            f"GPU types a cloud: section knows: {', '.join(known_names())}", markup=False, highlight=False
        )
