"""trainer.placement: the packing of Ray Train's bundles onto nodes, and a real local Ray cluster (1 CPU) that
cannot place the job's workers: PENDING lines with the demand, then ResourcesUnavailable after the bound."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories import train_config, train_job
from trainer import progress
from trainer.errors import ResourcesUnavailable, TrainerError
from trainer.placement import Demand, NodeRoom, cluster_nodes, limit_s, place, wait_for_room
from trainer.train import train_with_ray


def node(name: str, **resources: float) -> NodeRoom:
    return NodeRoom(name, resources, resources)


def test_the_bundle_is_ray_trains() -> None:
    assert Demand.of(2, {"CPU": 1, "GPU": 0}, use_gpu=False).per_worker == {"CPU": 1.0}
    assert Demand.of(2, {"CPU": 4}, use_gpu=True).per_worker == {"CPU": 4.0, "GPU": 1.0}
    assert str(Demand.of(2, {"CPU": 1, "absent": 0.5}, use_gpu=False)) == "2 x {CPU: 1, absent: 0.5}"


def test_bundles_pack_per_node_and_never_span_two() -> None:
    demand = Demand(3, {"CPU": 2, "GPU": 1})
    # 3 GPUs in all, but the 1-CPU node cannot hold a bundle: a bundle does not span nodes.
    nodes = [node("a", CPU=4, GPU=2), node("b", CPU=1, GPU=1)]
    placement = place(demand, nodes)
    assert placement.per_node == (2, 0) and not placement.fits
    assert placement.why == "the cluster's nodes hold 2 of the 3 workers' {CPU: 2, GPU: 1} even when idle"
    assert place(demand, [*nodes, node("c", CPU=2.0000001, GPU=1)]).fits
    assert place(Demand(4, {"CPU": 0.1}), [node("a", CPU=0.4)]).fits  # fixed-point amounts add up


def test_why_names_what_no_node_has_and_what_is_in_use() -> None:
    missing = place(Demand(1, {"CPU": 1, "absent": 1}), [node("a", CPU=8)])
    assert missing.why == (
        "no node of the cluster is big enough for one worker's {CPU: 1, absent: 1} "
        "(no node has absent at all)"
    )
    busy = place(Demand(2, {"CPU": 1}), [NodeRoom("a", {"CPU": 2}, {"CPU": 1})])
    assert busy.per_node == (1,)
    assert busy.why == "1 of the 2 workers' {CPU: 1} fit in what the nodes have free now"
    assert place(Demand(1, {"CPU": 1}), []).why is not None


def test_the_bound_comes_from_the_fleets_variable() -> None:
    assert limit_s({}) == 600
    assert limit_s({progress.PENDING_ENV: "2.5"}) == 2.5
    with pytest.raises(TrainerError, match="FLEET_TRAIN_PENDING_S='soon'"):
        limit_s({progress.PENDING_ENV: "soon"})


def test_a_wait_reports_every_interval_and_goes_on_when_a_node_joins(
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = [0.0]
    nodes = [node("head", CPU=1)]

    def look() -> list[NodeRoom]:
        if now[0] >= 70:  # a worker node joins after 70 s
            return [*nodes, node("worker", CPU=1)]
        return nodes

    def sleep(seconds: float) -> None:
        now[0] += seconds

    wait_for_room(Demand(2, {"CPU": 1}), 600, look=look, every_s=5, clock=lambda: now[0], sleep=sleep)
    lines = list(progress.parse(capsys.readouterr().out))
    assert [(r["kind"], r["waited_s"], r["gave_up"]) for r in lines] == [
        ("pending", 0, False),
        ("pending", 30, False),
        ("pending", 60, False),
    ]
    assert lines[0]["cluster"] == "1 node (free/total): {CPU: 1/1}"


@pytest.fixture(scope="module")
def one_cpu_ray() -> Iterator[None]:
    """One real local Ray cluster with 1 CPU for the module (its start costs seconds)."""
    import ray

    temp = tempfile.mkdtemp(prefix="tfpl-", dir="/tmp")  # short: Ray's socket paths must stay short
    ray.init(address="local", num_cpus=1, include_dashboard=False, _temp_dir=temp)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(120)  # the code before trainer.placement waited here forever
def test_workers_ray_cannot_place_are_reported_then_fail(
    one_cpu_ray: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert [n.total["CPU"] for n in cluster_nodes()] == [1]
    monkeypatch.setenv(progress.PENDING_ENV, "2")
    job = train_job(tmp_path, train_config(use_ray=True, ray_num_workers=2, resources_per_worker={"CPU": 1}))
    started = time.monotonic()
    with pytest.raises(ResourcesUnavailable) as raised:
        train_with_ray(job, tmp_path / "model", tmp_path)
    assert time.monotonic() - started < 30
    assert str(raised.value).startswith(
        "Ray cannot place the training workers: 2 x {CPU: 1} asked, the cluster's nodes hold 1 of the 2 "
        "workers' {CPU: 1} even when idle; the cluster has 1 node (free/total): {CPU: 1/1}; waited 2 s"
    )
    lines: list[dict[str, Any]] = list(progress.parse(capsys.readouterr().out))
    assert [r["kind"] for r in lines] == ["pending", "pending"]
    first, last = lines
    assert (first["gave_up"], last["gave_up"]) == (False, True)
    assert first["demand"] == "2 x {CPU: 1}" and first["workers"] == 2 and first["per_worker"] == {"CPU": 1}
    assert [(n["total"], n["available"], n["fit"]) for n in last["nodes"]] == [({"CPU": 1}, {"CPU": 1}, 1)]
    assert last["waited_s"] >= 2 and last["limit_s"] == 2


def test_a_custom_resource_no_node_has_is_named(one_cpu_ray: None) -> None:
    demand = Demand.of(1, {"CPU": 1, "absent": 1}, use_gpu=False)
    with pytest.raises(ResourcesUnavailable, match=r"no node has absent at all\); the cluster has 1 node"):
        wait_for_room(demand, 0)
    wait_for_room(Demand.of(1, {"CPU": 1}, use_gpu=False), 0)  # fits: returns at once
