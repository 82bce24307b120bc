"""The vast.ai fake, driven by the real vastai 1.9.1 SDK (`VastAI(api_key=, server_url=)`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from vastai import VastAI

from providers.local.client import LocalHeads
from tests.fakes import FakeVastAI

pytestmark = pytest.mark.integration

KEY = "vast-test-key"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVastAI]:
    # A node is ready 2 s after its create: a test may read it as still loading right after the create, even
    # on a loaded machine (at 0.1 s a CI run once saw it running already).
    with FakeVastAI(api_key=KEY, home=tmp_path, nodes="none", ready_delay_s=2.0, page_size=2) as server:
        yield server


@pytest.fixture
def vast(fake: FakeVastAI) -> VastAI:
    return VastAI(api_key=KEY, server_url=fake.url)


def wait_running(vast: VastAI, instance_id: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = vast.show_instance(instance_id)
        if row and row["actual_status"] == "running":
            return dict(row)
        time.sleep(0.05)
    raise AssertionError(f"instance {instance_id} never ran")


def test_search_filters_and_order(vast: VastAI, fake: FakeVastAI) -> None:
    offers = vast.search_offers("gpu_name=RTX_4090 num_gpus=1 dph<1", order="dph_total")
    assert [o["id"] for o in offers] == [1004]  # 1005 is unverified: the default filter drops it
    offers = vast.search_offers(
        "gpu_name in [RTX_4090,RTX_A6000] gpu_ram>=24", order="dph_total", no_default=True
    )
    prices = [o["dph_total"] for o in offers]
    assert prices == sorted(prices) and {o["gpu_name"] for o in offers} == {"RTX 4090", "RTX A6000"}
    assert len(offers) == 5
    bids = vast.search_offers("num_gpus=1 reliability>0.99", type="bid", order="dph_total-", limit=2)
    assert [o["dph_total"] for o in bids] == [0.55, 0.21]  # min_bid, most expensive first
    assert vast.search_offers("gpu_name notin [RTX_4090,RTX_A6000,RTX_A5000,A100_PCIE]")[0]["id"] == 1007
    assert fake.state()["requests"]["search"] == 4


def test_instance_lifecycle(vast: VastAI, fake: FakeVastAI) -> None:
    made = vast.create_instance(1002, image="img:1", disk=20, env="-e FLEET_RAY_TOKEN=s3cret -p 8265:8265",
                                label="tf-run-1", onstart_cmd="echo hi")  # fmt: skip
    assert made["success"] is True
    bid = vast.create_instance(1004, image="img:1", env={"A": "b"}, label="tf-spot", bid_price=0.2)
    ident = int(made["new_contract"])
    row = vast.show_instance(ident)
    assert row is not None and row["actual_status"] in (None, "loading")
    assert row["gpu_util"] is None and row["ports"] == {}

    row = wait_running(vast, ident)
    assert row["public_ipaddr"] == "127.0.0.1"
    assert int(row["ports"]["8265/tcp"][0]["HostPort"]) > 0
    assert (row["label"], row["is_bid"], row["dph_total"]) == ("tf-run-1", False, 0.42)

    state = fake.state()
    assert {r["name"]: r["bid"] for r in state["instances"]} == {"tf-run-1": None, "tf-spot": 0.2}
    assert "s3cret" not in str(state) and state["instances"][0]["env_keys"] == ["FLEET_RAY_TOKEN"]

    assert vast.change_bid(int(bid["new_contract"]), price=0.25) == {"success": True}
    rows = vast.show_instances()  # page_size=2: two pages
    assert [r["label"] for r in rows] == ["tf-run-1", "tf-spot"]
    assert rows[1]["dph_total"] == 0.25 and rows[1]["is_bid"] is True

    assert vast.destroy_instance(ident) == {"success": True}
    assert vast.show_instance(ident) is None
    assert [r["label"] for r in vast.show_instances()] == ["tf-spot"]
    with pytest.raises(requests.HTTPError):
        vast.destroy_instance(ident)
    with pytest.raises(requests.HTTPError):  # the offer is rented
        vast.create_instance(1004, image="img", bid_price=0.5)


def test_stop_start_and_preempt(vast: VastAI, fake: FakeVastAI) -> None:
    ident = int(vast.create_instance(1001, image="img", bid_price=0.1)["new_contract"])
    wait_running(vast, ident)
    vast.stop_instance(ident)
    assert vast.show_instance(ident)["actual_status"] == "exited"
    vast.start_instance(ident)
    wait_running(vast, ident)
    assert requests.post(f"{fake.url}/_fake/preempt/{ident}", timeout=5).json() == {"preempted": True}
    row = vast.show_instance(ident)
    assert (row["actual_status"], row["intended_status"]) == ("stopped", "running")


def test_429_with_retry_after_is_retried(vast: VastAI, fake: FakeVastAI) -> None:
    fake.add_faults([{"op": "search", "kind": "429", "retry_after": 0.2}])
    started = time.monotonic()
    assert vast.search_offers("num_gpus=1")
    assert time.monotonic() - started >= 0.2
    assert fake.state()["requests"]["search"] == 2


def test_faults(vast: VastAI, fake: FakeVastAI) -> None:
    fake.add_faults([{"op": "create", "kind": "error_after_create"}])
    with pytest.raises(requests.HTTPError):
        vast.create_instance(1006, image="img", label="tf-half")
    (row,) = fake.state()["instances"]
    assert row["name"] == "tf-half"

    fake.add_faults([{"op": "list", "kind": "500"}])
    with pytest.raises(requests.HTTPError):
        vast.show_instances()
    fake.add_faults([{"op": "terminate", "kind": "not_found"}])
    with pytest.raises(requests.HTTPError):
        vast.destroy_instance(int(row["id"]))
    fake.add_faults([{"op": "terminate", "kind": "terminate_ok_but_listed", "times": 2}])
    assert vast.destroy_instance(int(row["id"])) == {"success": True}
    assert vast.show_instance(int(row["id"]))["actual_status"] == "running"
    assert [r["label"] for r in vast.show_instances()] == ["tf-half"]
    assert vast.show_instances() == []


def test_wrong_key_fails(fake: FakeVastAI) -> None:
    with pytest.raises(requests.HTTPError, match="401"):
        VastAI(api_key="wrong", server_url=fake.url).show_instances()
    ok = requests.get(f"{fake.url}/api/v0/instances/1/", params={"api_key": KEY}, timeout=5)
    assert ok.json() == {"instances": None}


def test_ray_node_behind_published_port(tmp_path: Path) -> None:
    token = "fake-ray-token-abcdef"
    with FakeVastAI(api_key=KEY, home=tmp_path, nodes="ray") as server:
        vast = VastAI(api_key=KEY, server_url=server.url)
        ident = int(vast.create_instance(1002, image="img", env={"FLEET_RAY_TOKEN": token})["new_contract"])
        row = wait_running(vast, ident, timeout=120)
        port = row["ports"]["8265/tcp"][0]["HostPort"]
        url = f"http://127.0.0.1:{port}/api/version"
        assert requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
        heads = LocalHeads(tmp_path / "nodes")
        meta = heads.read(f"vastai-{ident}")
        assert meta is not None and heads.processes(meta)
        vast.destroy_instance(ident)
        assert not heads.processes(meta)


def test_a_body_vastai_does_not_take_is_400_and_nothing_is_done(vast: VastAI, fake: FakeVastAI) -> None:
    """A mutating call's body is checked against the fields vast.ai documents for it before anything is
    done (tests.fakes.vastai_bodies): a create with a misspelled field makes no instance and leaves the
    offer rentable; a stop with a misspelled state stops nothing."""
    headers = {"Authorization": f"Bearer {KEY}"}
    refused = requests.put(
        f"{fake.url}/api/v0/asks/1002/",
        json={"client_id": "me", "image": "img", "labl": "tf-1", "disk": 20},
        headers=headers,
        timeout=5,
    )
    assert refused.status_code == 400
    body = refused.json()
    assert (body["success"], body["error"]) == (False, "invalid_args")
    assert body["msg"].startswith("unknown field(s) labl; this call takes: args, args_str, cancel_unavail")
    assert fake.state()["instances"] == []
    ident = int(vast.create_instance(1002, image="img", label="tf-1")["new_contract"])  # still rentable
    assert [r["name"] for r in fake.state()["instances"]] == ["tf-1"]

    url = f"{fake.url}/api/v0/instances/{ident}/"
    stop = requests.put(url, json={"state": "stoped"}, headers=headers, timeout=5)
    assert (stop.status_code, stop.json()["msg"]) == (400, "invalid state 'stoped'; valid: running, stopped")
    label = requests.put(url, json={"label": "tf-2", "labl": "x"}, headers=headers, timeout=5)
    assert label.status_code == 400 and "unknown field(s) labl" in label.json()["msg"]
    assert [(r["name"], r["state"]) for r in fake.state()["instances"]] == [("tf-1", "starting")]
    assert vast.label_instance(ident, "tf-2") == {"success": True}  # what the library sends is taken
    assert [r["name"] for r in fake.state()["instances"]] == ["tf-2"]


def test_an_image_vastai_cannot_pull_never_boots_and_says_why(vast: VastAI, fake: FakeVastAI) -> None:
    """An instance of an image no one has stays `loading`, never running, and its status_msg carries
    docker's pull error once the pull has failed; a test registers an image to use one the fake does not
    know."""
    ident = int(vast.create_instance(1002, image="me/trainer:v2", label="tf-nope-1")["new_contract"])
    deadline = time.monotonic() + 10
    while "pull access denied" not in str((row := vast.show_instance(ident))["status_msg"]):
        assert row["actual_status"] in (None, "loading") and time.monotonic() < deadline, row
        time.sleep(0.05)
    assert row["actual_status"] == "loading" and row["ports"] == {}
    assert row["status_msg"].startswith(
        "Error response from daemon: pull access denied for me/trainer, repository does not exist"
    )
    fake.register_image("me/trainer:v2")
    assert wait_running(vast, int(vast.create_instance(1003, image="me/trainer:v2")["new_contract"]))
    assert vast.show_instance(ident)["actual_status"] == "loading"  # the pull failed: still nothing runs
