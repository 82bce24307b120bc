"""`fleet instances`, `fleet terminate`, `fleet node`, `fleet ssh`, `fleet jupyter`: the
machines behind the runs, and the ways into one; `fleet volumes`: the storage volumes the fleet made for
jobs (`network_volume:`), what each costs a month, and `--delete ID`; `fleet pools`: the operator's own
machines, and which run holds each."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from typing import Annotated

import typer
from rich.table import Table

from core.errors import FleetError, NodeError, NotFound
from fleet.cli_common import JsonOpt, connect_or_exit, err, out, world_or_exit
from providers.base import INSTANCE_PREFIX, NodeEndpoint
from providers.cluster import NodeSummary, cluster_nodes, cluster_status, node_summary
from service.runs import Fleet


def register(cli: typer.Typer) -> None:
    """Add these commands to the `fleet` app."""
    cli.command()(instances)
    cli.command()(terminate)
    cli.command()(node)
    cli.command()(ssh)
    cli.command()(jupyter)
    cli.command()(volumes)
    cli.command()(pools)


def instances(as_json: JsonOpt = False) -> None:
    """The fleet's live instances at every provider (state, age, $/h, run)."""
    from service.instances import live_instances

    rows = live_instances(connect_or_exit(world_or_exit(), reading=True))
    if as_json:
        out.print_json(json.dumps([r.view() for r in rows]))
        return
    table = Table()
    table.add_column("instance", no_wrap=True)
    for name in ("provider", "state", "age", "$/h", "run", "run state"):
        table.add_column(name)
    for r in rows:
        v = r.view()
        table.add_row(
            v["name"],
            v["provider"],
            v["state"],
            f"{v['age_s'] / 60:.0f}m",
            f"{v['price_per_hour']:.3f}",
            v["run_id"] or "-",
            v["run_state"] or "-",
        )
    out.print(table)


def terminate(
    name: Annotated[
        str, typer.Argument(help="An instance name (tf-<run>-<attempt>), see `fleet instances`.")
    ],
    force: Annotated[bool, typer.Option(help="Even when its run is still going.")] = False,
) -> None:
    """Terminate one of the fleet's instances now."""
    from service.instances import terminate as terminate_instance

    fleet = connect_or_exit(world_or_exit())
    try:
        row = terminate_instance(fleet, name, force=force)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    out.print(f"terminated {row.node.name} ({row.node.provider.value})", highlight=False)


def node(
    ident: Annotated[
        str,
        typer.Argument(metavar="ID", help="A run id (or prefix) or an instance name, see `fleet instances`."),
    ],
    as_json: JsonOpt = False,
) -> None:
    """The Ray cluster of a run or instance as its head sees it (what `ray status` shows): every node, head
    and workers, with CPUs, GPUs, memory and what is in use; and what the head's readiness check found."""
    from service.instances import find_provider

    fleet = connect_or_exit(world_or_exit(), reading=True)
    try:
        name = _head_of(fleet, ident)
        endpoint = find_provider(fleet, name).endpoint(name)
        status, nodes = _cluster_status(endpoint)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    record = fleet.ledger.get_instance(name)
    check = record.check if record is not None else None  # what its readiness check found
    if as_json:
        out.print_json(json.dumps({"instance": name, "dashboard_url": endpoint.dashboard_url, "nodes": nodes,
                                   "status": status,
                                   "check": check.model_dump(mode="json") if check else None}))  # fmt: skip
        return
    out.print(f"{name}  dashboard {endpoint.dashboard_url}", highlight=False)
    if check is not None:
        gpus = ", ".join(check.gpu_names) or ("CPU stand-in" if check.cpu_standin else "none")
        libraries = " ".join(f"{k} {v}" for k, v in check.versions.items() if k in ("torch", "ray", "peft"))
        out.print(f"ready: Python {check.python} ({check.executable}), {libraries}, GPUs: {gpus}",
                  highlight=False, markup=False)  # fmt: skip
    table = Table("node", "ip", "role", "state", "CPUs", "GPUs", "memory GiB", "accelerator")
    for n in nodes:
        table.add_row(
            str(n["node_id"])[:12],
            str(n["node_ip"]),
            "head" if n["head"] else "worker",
            str(n["state"]),
            f"{n['cpus']:g}",
            f"{n['gpus']:g}",
            f"{n['memory_gb']:g}",
            n["accelerator"] or "-",
        )
    out.print(table)
    print(status)


RunArg = Annotated[
    str,
    typer.Argument(metavar="RUN", help="A run id (or prefix): its node (the head); or an instance name."),
]


def ssh(
    ident: RunArg,
    run_ssh: Annotated[bool, typer.Option("--exec", help="Run ssh now, in fleet's place.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The ssh command into a run's node (one kept for debugging, say): `ssh -p PORT root@HOST`, with
    `-i` when the fleet's ssh_public_key is a .pub file whose private key sits beside it."""
    from service.nodeaccess import ssh_command

    fleet = connect_or_exit(world_or_exit(), reading=True)
    try:
        command = ssh_command(fleet, ident)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        out.print_json(json.dumps(command.view()))
    elif run_ssh:
        os.execvp("ssh", command.argv())
    else:
        out.print(command.text(), markup=False, highlight=False)


def jupyter(ident: RunArg, as_json: JsonOpt = False) -> None:
    """The URL of the JupyterLab on a run's node (`jupyter: true` in its section), with its token: for your
    eyes only, as the holder of the fleet's home (never paste it where others read). On a vast.ai node it
    is https with the certificate the fleet made for the node: its SHA-256 fingerprint, to check in the
    browser, goes to stderr (`--json`: `certificate`, `sha256`)."""
    from service.nodeaccess import jupyter_access

    fleet = connect_or_exit(world_or_exit(), reading=True)
    try:
        access = jupyter_access(fleet, ident)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        out.print_json(json.dumps(access.view()))
        return
    out.print(access.url, markup=False, highlight=False)
    note = access.trust_note()
    if note is not None:
        err.print(note, markup=False, highlight=False)


def _head_of(fleet: Fleet, ident: str) -> str:
    """The instance whose Ray head serves `ident`: the instance itself, the head a cluster's worker node
    joined, or the head of a run's current attempt."""
    record = fleet.ledger.get_instance(ident)
    if record is not None:
        return record.head or ident
    if not ident.startswith(INSTANCE_PREFIX):
        try:
            run = fleet.ledger.find_run(ident)
        except NotFound:
            pass
        else:
            if run.instance is None:
                raise NodeError(f"run {run.run_id} has no node yet ({run.state.value})")
            return run.instance
    return ident


class _NodeRow(NodeSummary):
    """A node of `fleet node`: its summary and its state (ALIVE, DEAD)."""

    state: str | None


def _cluster_status(endpoint: NodeEndpoint, wait_s: float = 15.0) -> tuple[str, list[_NodeRow]]:
    """`ray status`'s text and the node list, from the head's dashboard (waits while it warms up)."""
    deadline = time.monotonic() + wait_s
    while True:
        status, listed = cluster_status(endpoint), cluster_nodes(endpoint)
        if (listed and not status.startswith("No cluster status")) or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    return status, [_NodeRow(**node_summary(n), state=n.state) for n in listed]


def volumes(
    delete: Annotated[
        str | None,
        typer.Option("--delete", metavar="ID", help="Delete this volume (its id), and every file on it."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Delete without asking.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The fleet's storage volumes at every provider (id, name, where, size, $/month); they bill by the
    month, used or not, until deleted."""
    from service.volumes import delete_volume, fleet_volumes

    world = world_or_exit()
    try:
        if delete is not None:
            if not yes and not typer.confirm(f"Delete volume {delete} and every file on it?"):
                raise typer.Exit(1)
            gone = delete_volume(world, delete)
            out.print(f"deleted {gone.name} ({gone.volume_id}, {gone.provider.value})", highlight=False)
            return
        rows = fleet_volumes(world)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        out.print_json(json.dumps([{**asdict(v), "provider": v.provider.value} for v in rows]))
        return
    table = Table()
    for name in ("id", "name", "provider", "where", "GB", "$/month"):
        table.add_column(name, no_wrap=name == "id")
    for v in rows:
        table.add_row(v.volume_id, v.name, v.provider.value, v.where, str(v.size_gb), f"{v.monthly_usd:.2f}")
    out.print(table)
    out.print(f"{len(rows)} volume(s), ${sum(v.monthly_usd for v in rows):.2f} a month", highlight=False)


def pools(as_json: JsonOpt = False) -> None:
    """The operator's pools (ssh_pools_file): each machine, its GPUs and $/h, and the run that holds it and
    for how long."""
    from service.pools import pool_rows

    fleet = connect_or_exit(world_or_exit(), reading=True)
    try:
        rows = pool_rows(fleet.world)
    except FleetError as exc:
        err.print(str(exc), style="red", markup=False, highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        out.print_json(json.dumps([asdict(r) for r in rows]))
        return
    table = Table()
    for name in ("pool", "machine", "user", "GPUs", "labels", "$/h", "held by", "for"):
        table.add_column(name, no_wrap=name == "machine")
    for r in rows:
        gpus = f"{r.gpus} x {r.gpu}" if r.gpus else "none"
        holder = "-" if r.run_id is None else f"{r.run_id} ({r.instance}{'' if r.node_up else ', starting'})"
        held = "-" if r.held_s is None else f"{r.held_s / 60:.0f}m"
        table.add_row(
            r.pool, r.machine, r.user, gpus, ", ".join(r.labels), f"{r.hourly_usd:.2f}", holder, held
        )
    out.print(table)
    free = sum(1 for r in rows if r.run_id is None)
    out.print(f"{len(rows)} machine(s), {free} free", highlight=False)
