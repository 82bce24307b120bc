"""A `cloud:` job against both fake clouds at once (each its own process, as a user runs them, with real local
Ray heads as nodes): it lands on the cheaper, moves to the other when the cheaper's create finds no capacity,
and fails NO_CAPACITY naming each offer it tried when both are out; in every case no more than one instance
is ever live under the run and none is left.

The fakes' RTX A5000: vast.ai's offer 1001 (a community host) at a minimum bid of $0.09/h; RunPod's at
$0.11 (community spot) and $0.13 (secure spot) per GPU per hour."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.hub import FakeHub
from tests.integration.clouds import API_KEY, HF_TOKEN, VAST_KEY, MostLive, fake_state, job_for, serving
from tests.integration.fleetproc import (
    Worker,
    events_of,
    fleet,
    fleet_env,
    fleet_json,
    secret_hits,
    wait_for_end,
)
from tests.integration.fleetproc import wait_until as wait

pytestmark = pytest.mark.integration

CLOUD = (
    "cloud:\n  gpu: rtx a5000\n  cloud_type: ALL\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
    "  pod_type: INTERRUPTABLE\n"
)


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Both fake clouds, each serving from a home of its own: {"runpod": url, "vastai": url}."""
    with (
        serving("runpod", tmp_path / "fake-runpod", API_KEY) as runpod,
        serving("vastai", tmp_path / "fake-vastai", VAST_KEY) as vastai,
    ):
        yield {"runpod": runpod, "vastai": vastai}


def env_of(home: Path, clouds: dict[str, str]) -> dict[str, str]:
    """A test fleet's environment with both clouds' URLs and keys."""
    return fleet_env(
        home,
        RUNPOD_API_BASE_URL=clouds["runpod"],
        RUNPOD_API_KEY=API_KEY,
        VAST_URL=clouds["vastai"],
        VAST_API_KEY=VAST_KEY,
    )


def run_cloud_job(home: Path, tmp_path: Path, clouds: dict[str, str]) -> tuple[dict[str, Any], list[Any]]:
    """`fleet run --json` of the cloud job while both fakes' live instances are watched; the run's view
    and events. Checks what every case must hold: at most one instance live at once on each cloud, and
    none left on either."""
    env = env_of(home, clouds)
    watches = {name: MostLive(url) for name, url in clouds.items()}
    done = fleet(env, "run", str(job_for(tmp_path, CLOUD)), "--json", timeout=420)
    most = {name: watch.stop() for name, watch in watches.items()}
    assert done.stdout.strip(), done.stderr[-3000:]
    view = json.loads(done.stdout)
    assert (done.returncode == 0) == (view["state"] == "SUCCEEDED"), done.stderr[-2000:]
    assert sum(most.values()) <= 1, most  # one instance at a time, across the clouds
    for url in clouds.values():
        assert fake_state(url)["instances"] == []
    for key in (API_KEY, VAST_KEY):
        assert secret_hits(home, key) == []
    view["most_live"] = most
    return view, events_of(home, view["run_id"])


def no_capacity(url: str, times: int) -> None:
    """The fake's next `times` creates are refused for capacity (nothing is made)."""
    rules = json.dumps([{"op": "create", "kind": "no_capacity", "times": times}]).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}/_fake/faults", data=rules), timeout=10).close()


def of(evs: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in evs if e["type"] == kind]


def test_a_cloud_job_lands_on_the_cheapest_offer_of_any_cloud(
    home: Path, tmp_path: Path, clouds: dict[str, str]
) -> None:
    view, evs = run_cloud_job(home, tmp_path, clouds)
    assert view["state"] == "SUCCEEDED" and view["provider"] == "vastai", view.get("failure_message")
    (chosen,) = of(evs, "offer.chosen")
    assert (chosen["cloud"], chosen["offer"], chosen["gpu"], chosen["price_per_hour"]) == (
        "vastai", "1001", "RTX-A5000", 0.09,
    )  # fmt: skip
    assert chosen["fits"] == 3  # vast.ai's 1001 and RunPod's community and secure A5000s
    (requested,) = of(evs, "instance.requested")
    assert requested["provider"] == "vastai" and requested["instance"] == f"tf-{view['run_id']}-1"
    assert fake_state(clouds["vastai"])["requests"]["create"] == 1
    assert "create" not in fake_state(clouds["runpod"])["requests"]  # RunPod was asked for offers only
    assert view["metrics"]["eval_loss"] < view["metrics"]["eval_loss_first"]


def test_no_capacity_on_the_cheaper_cloud_moves_the_run_to_the_other(
    home: Path, tmp_path: Path, clouds: dict[str, str]
) -> None:
    no_capacity(clouds["vastai"], times=1)
    view, evs = run_cloud_job(home, tmp_path, clouds)
    assert view["state"] == "SUCCEEDED" and view["provider"] == "runpod", view.get("failure_message")
    first, second = of(evs, "offer.chosen")
    assert (first["cloud"], first["attempt"], second["cloud"], second["attempt"]) == (
        "vastai",
        1,
        "runpod",
        2,
    )
    assert second["offer"] == "NVIDIA RTX A5000/COMMUNITY" and second["price_per_hour"] == 0.11
    (left,) = of(evs, "offer.left")
    assert left["cloud"] == "vastai" and left["offer"] == "1001" and "no longer available" in left["why"]
    # The refused create made nothing; the run went on under the next attempt's name.
    (requested,) = of(evs, "instance.requested")
    assert requested == {"instance": f"tf-{view['run_id']}-2", "provider": "runpod", "price_per_hour": 0.11}
    assert view["most_live"] == {"runpod": 1, "vastai": 0}
    vast = fake_state(clouds["vastai"])
    assert vast["faults_served"] == {"create:no_capacity": 1} and vast["most_live"] == {}
    assert fake_state(clouds["runpod"])["requests"]["create"] == 1
    types = [e["type"] for e in evs]
    assert types.index("offer.left") < types.index("instance.requested")


def test_with_every_cloud_out_the_run_fails_no_capacity_naming_what_it_tried(
    home: Path, tmp_path: Path, clouds: dict[str, str]
) -> None:
    for url in clouds.values():
        no_capacity(url, times=5)
    view, evs = run_cloud_job(home, tmp_path, clouds)
    assert view["state"] == "FAILED" and view["failure_reason"] == "NO_CAPACITY"
    message = view["failure_message"]
    for tried in ("vastai:1001", "runpod:NVIDIA RTX A5000/COMMUNITY", "runpod:NVIDIA RTX A5000/SECURE"):
        assert tried in message, message
    assert "3 offer(s) tried (max_attempts)" in message and "no longer available" in message
    assert [e["attempt"] for e in of(evs, "offer.left")] == [1, 2, 3]
    assert of(evs, "instance.requested") == [] and view["most_live"] == {"runpod": 0, "vastai": 0}
    status = fleet(env_of(home, clouds), "status", view["run_id"], timeout=60)  # each offer, why it was left
    shown = " ".join(status.stdout.split())
    assert (
        "offer 1 vastai 1001 (RTX-A5000) $0.090/h: left, vast.ai: Instance type no longer available" in shown
    )
    assert "offer 3 runpod NVIDIA RTX A5000/SECURE (RTX-A5000) $0.130/h: left" in shown


def test_a_run_preempted_on_one_cloud_resumes_on_the_other_from_its_checkpoint(
    home: Path, tmp_path: Path, clouds: dict[str, str]
) -> None:
    """Preempted on vast.ai (the cheaper) while vast.ai has no capacity left: the replacement is rented on
    RunPod and the trainer resumes there from the checkpoint the vast.ai node pushed to the (fake) hub."""
    job = job_for(tmp_path, CLOUD, extra="hub_model_id: tester/anycloud\nhub_strategy: checkpoint\n")
    job.write_text(
        job.read_text().replace("use_ray: true", "use_ray: false").replace("save_steps: 40", "save_steps: 10")
    )
    with FakeHub(home=tmp_path / "hub", token=HF_TOKEN) as hub:
        env = fleet_env(
            home, RUNPOD_API_BASE_URL=clouds["runpod"], RUNPOD_API_KEY=API_KEY, VAST_URL=clouds["vastai"],
            VAST_API_KEY=VAST_KEY, HF_TOKEN=HF_TOKEN, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1",
            FLEET_PREEMPT_BACKOFF_S="1",
        )  # fmt: skip
        worker = Worker(env, home / "worker.log")
        watches = {name: MostLive(url) for name, url in clouds.items()}
        try:
            (queued,) = fleet_json(env, "enqueue", str(job))
            run_id = queued["run_id"]

            def checkpointed() -> int | None:
                evs = events_of(home, run_id)
                assert "run.failed" not in [e["type"] for e in evs], evs[-3:]
                steps = [e["data"]["step"] for e in evs if e["type"] == "train.checkpoint"]
                return steps[-1] if steps and evs[-1]["type"] != "train.finished" else None

            at = wait(checkpointed, 300, "a checkpoint on the vast.ai node", every=0.2)
            no_capacity(clouds["vastai"], times=5)
            (instance,) = fake_state(clouds["vastai"])["instances"]
            request = f"{clouds['vastai']}/_fake/preempt/{instance['id']}"
            urllib.request.urlopen(
                urllib.request.Request(request, data=b"", method="POST"), timeout=10
            ).close()
            view = wait_for_end(env, run_id, timeout=420)
        finally:
            most = {name: watch.stop() for name, watch in watches.items()}
            worker.stop()
    assert view["state"] == "SUCCEEDED" and view["provider"] == "runpod", view.get("failure_message")
    evs = events_of(home, run_id)
    chosen = [(e["cloud"], e["attempt"]) for e in of(evs, "offer.chosen")]
    assert chosen == [("vastai", 1), ("vastai", 2), ("runpod", 3)]  # vast.ai asked again first: cheapest
    (preempted,) = of(evs, "run.preempted")
    assert preempted["instance"] == f"tf-{run_id}-1"
    (left,) = of(evs, "offer.left")
    assert left["attempt"] == 2 and "no longer available" in left["why"]
    (resumed,) = of(evs, "train.resumed")
    assert resumed["step"] >= at  # from the checkpoint the vast.ai node pushed, on the RunPod node
    requested = [(e["instance"], e["provider"]) for e in of(evs, "instance.requested")]
    assert requested == [(f"tf-{run_id}-1", "vastai"), (f"tf-{run_id}-3", "runpod")]
    assert most == {"runpod": 1, "vastai": 1}
    for url in clouds.values():
        assert fake_state(url)["instances"] == []
    assert secret_hits(home, HF_TOKEN) == []


def test_offers_and_plan_show_every_clouds_and_a_fleet_without_keys_refuses_the_job(
    home: Path, tmp_path: Path, clouds: dict[str, str]
) -> None:
    job = job_for(tmp_path, CLOUD.replace("gpu: rtx a5000", "gpu: [RTX-A5000, rtx 4090]"))
    env = fleet_env(
        home, RUNPOD_API_BASE_URL=clouds["runpod"], RUNPOD_API_KEY=API_KEY, VAST_URL=clouds["vastai"]
    )
    done = fleet(env, "offers", str(job), "--json", timeout=120)  # vast.ai: no key here
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    assert [(f["cloud"], f["offer"], f["gpu"]) for f in shown["fits"]] == [
        ("runpod", "NVIDIA RTX A5000/COMMUNITY", "RTX-A5000"),
        ("runpod", "NVIDIA RTX A5000/SECURE", "RTX-A5000"),
        ("runpod", "NVIDIA GeForce RTX 4090/COMMUNITY", "RTX-4090"),
        ("runpod", "NVIDIA GeForce RTX 4090/SECURE", "RTX-4090"),
    ]
    assert shown["unasked"] == [{"cloud": "vastai", "why": shown["unasked"][0]["why"]}]
    assert shown["unasked"][0]["why"].startswith("VAST_API_KEY is not set")
    both = {**env, "VAST_API_KEY": VAST_KEY}
    plan = fleet(both, "validate", str(job), "--plan", "--json", timeout=120)
    (planned,) = json.loads(plan.stdout)
    assert planned["provider"] == "cloud" and planned["gpu"] == "RTX-A5000 or RTX-4090"
    assert planned["price_per_hour"] == 0.09 and "RTX-A5000 on vastai" in planned["price_note"]
    # With no key for either cloud the job is refused at submit, naming both, and nothing is queued.
    bare = {k: v for k, v in env.items() if k != "RUNPOD_API_KEY"}
    refused = fleet(bare, "enqueue", str(job), timeout=120)
    assert refused.returncode != 0
    assert "no credential for any cloud it may use: RUNPOD_API_KEY is not set; VAST_API_KEY is not set" in (
        refused.stderr
    )
    assert fleet_json(bare, "status") == []
