"""The vast.ai adapter against the fake vast.ai API (no Ray nodes: wire behaviour and error handling)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from pydantic import SecretStr

from core.errors import AuthFailed, NoCapacity, ProviderUnavailable
from providers.base import LaunchRequest, NodeState, ProviderContext
from providers.listing import ListingCache, RedisListings
from providers.vastai.client import VastAIClient, offer_query
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes.base import Instance
from tests.fakes.vastai import FakeVastAI

pytestmark = pytest.mark.integration
KEY = "vast-test-key-0123"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=KEY, home=tmp_path / "fake", nodes="none", ready_delay_s=0.1) as fake:
        yield fake


def provider_for(fake: FakeVastAI, tmp_path: Path, key: str = KEY) -> VastAIProvider:
    context = ProviderContext(
        home=tmp_path, credentials={"VAST_API_KEY": SecretStr(key)}, urls={"vastai": fake.url}
    )
    return VastAIProvider(context)


SECTION = VastAISection(
    gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, pod_type="INTERRUPTABLE"
)  # 1001: 0.09


def test_offers_fit_the_section_cheapest_first_and_say_why_not(fake: FakeVastAI, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    loose = VastAISection(
        gpu="RTX 4090", cloud_type="ALL", verified_only=False, max_bid_per_gpu=0.5, pod_type="INTERRUPTABLE"
    )
    assert [p.candidate.offer_id for p in provider.choose(loose).fits] == ["1005", "1004"]

    capped = provider.choose(loose.model_copy(update={"max_bid_per_gpu": 0.16}))
    assert [(p.candidate.offer_id, p.bid_per_gpu) for p in capped.fits] == [("1005", 0.14)]
    why = {r.candidate.offer_id: r.reasons for r in capped.rejected}
    assert why == {"1004": ("minimum bid $0.170/GPU/h is above max_bid_per_gpu $0.160",)}

    strict = provider.choose(loose.model_copy(update={"min_reliability": 0.96}))
    assert [p.candidate.offer_id for p in strict.fits] == ["1004"]
    assert not strict.rejected  # the search itself left 1005 (0.952) out: vast.ai filters on reliability

    on_demand = provider.list_offers(loose.model_copy(update={"pod_type": "ON_DEMAND"}))
    assert [(o.offer_id, o.price_per_hour) for o in on_demand] == [("1005", 0.29), ("1004", 0.35)]


def test_the_reliability_and_datacenter_filters_filter_and_a_misspelled_one_fails(fake: FakeVastAI) -> None:
    client = VastAIClient(SecretStr(KEY), fake.url)

    def ids(**asks: Any) -> list[int]:
        return [int(o.id or 0) for o in client.search_offers(offer_query("RTX_4090", 1, **asks), bid=False)]

    assert ids(verified_only=False) == [1005, 1004]  # reliability 0.952 and 0.978, both community hosts
    assert ids(verified_only=False, min_reliability=0.96) == [1004]
    assert ids(verified_only=False, min_reliability=0.99) == []
    assert ids(verified_only=False, datacenter=True) == []  # the only datacenter 4090 is a 4-GPU machine
    assert ids(verified_only=False, datacenter=False) == [1005, 1004]
    a6000 = client.search_offers(offer_query("RTX_A6000", 1, datacenter=True), bid=False)
    assert [o.id for o in a6000] == [1002]
    # A typo is an error, never a filter that filters nothing.
    with pytest.raises(requests.HTTPError) as caught:
        client.search_offers({**offer_query("RTX_4090", 1), "reliabilty": {"gte": 0.9}}, bid=False)
    assert caught.value.response.status_code == 400 and "'reliabilty'" in caught.value.response.text
    with pytest.raises(requests.HTTPError, match="400"):
        client.search_offers({**offer_query("RTX_4090", 1), "num_gpus": {"atleast": 1}}, bid=False)


def test_a_bid_is_per_gpu_in_the_fleet_and_per_machine_at_vastai(fake: FakeVastAI, tmp_path: Path) -> None:
    section = VastAISection(
        gpu="RTX_A6000", gpu_count=2, max_bid_per_gpu=0.25, pod_type="INTERRUPTABLE"
    )  # 1003: min_bid 0.40/machine
    provider = provider_for(fake, tmp_path)
    (fit,) = provider.choose(section).fits
    assert (fit.bid_per_gpu, fit.price_per_hour) == (0.2, 0.4)
    assert provider.choose(section.model_copy(update={"max_bid_per_gpu": 0.19})).best is None

    inst = provider.launch(LaunchRequest("tf-r0-1", "r0", section))
    (row,) = fake.state()["instances"]
    assert (row["name"], row["bid"], row["gpu_count"]) == ("tf-r0-1", 0.2, 2)
    assert inst.price_per_hour == 0.4 and inst.state == NodeState.PENDING


def test_launch_bids_within_the_cap(fake: FakeVastAI, tmp_path: Path) -> None:
    inst = provider_for(fake, tmp_path).launch(LaunchRequest("tf-r1-1", "r1", SECTION))
    (row,) = fake.state()["instances"]
    assert row["name"] == "tf-r1-1" and row["bid"] == 0.09 and inst.price_per_hour == 0.09
    # The node's token travels in its env (by name only here), with its own deadline (terminate_after).
    assert row["env_keys"] == [
        "FLEET_DEADLINE_S", "FLEET_NODE_ACCESS", "FLEET_NODE_PINS", "FLEET_NODE_PYTHON_VERSION",
        "FLEET_NODE_SETUP", "FLEET_NODE_TLS_CERT", "FLEET_NODE_TLS_KEY", "FLEET_RAY_TOKEN", "FLEET_VAST_URL",
    ]  # fmt: skip
    extra: dict[str, Any] = fake.instances[str(row["id"])].extra
    assert extra["ports"] == ["8265:8265"] and "ray start --head" in extra["onstart"]
    assert extra["disk"] == SECTION.container_disk_in_gb


def test_a_launch_for_a_chosen_offer_rents_that_one_or_none(fake: FakeVastAI, tmp_path: Path) -> None:
    """A `cloud:` job's create is for the offer chosen among the clouds, not the cheapest one now."""
    provider = provider_for(fake, tmp_path)
    loose = VastAISection(
        gpu="RTX 4090", cloud_type="ALL", verified_only=False, max_bid_per_gpu=0.5, pod_type="INTERRUPTABLE"
    )
    inst = provider.launch(LaunchRequest("tf-r1-1", "r1", loose, offer="1004"))  # 1005 is cheaper
    (row,) = fake.state()["instances"]
    assert fake.instances[str(row["id"])].extra["offer"] == 1004 and inst.price_per_hour == 0.17
    with pytest.raises(NoCapacity, match=r"offer 1001 .* no longer offered, or no longer fits") as caught:
        provider.launch(LaunchRequest("tf-r2-1", "r2", loose, offer="1001"))  # an A5000: not this section's
    assert caught.value.made_nothing and len(fake.state()["instances"]) == 1


def test_error_after_create_leaves_exactly_one_instance(fake: FakeVastAI, tmp_path: Path) -> None:
    fake.add_faults([{"op": "create", "kind": "error_after_create"}])
    provider = provider_for(fake, tmp_path)
    inst = provider.launch(LaunchRequest("tf-r2-1", "r2", SECTION))
    assert inst.name == "tf-r2-1"
    assert [r["name"] for r in fake.state()["instances"]] == ["tf-r2-1"]
    provider.terminate("tf-r2-1")
    assert fake.state()["instances"] == [] and provider.get("tf-r2-1") is None


def test_a_duplicate_under_one_name_is_destroyed(fake: FakeVastAI, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(LaunchRequest("tf-r3-1", "r3", SECTION))
    provider.client.create_instance(  # as if a retried create had gone through twice
        1007, label="tf-r3-1", image="img", disk_gb=10, env={}, onstart="true", price=0.08
    )
    assert len(fake.state()["instances"]) == 2
    assert provider.get("tf-r3-1") is not None
    assert len(fake.state()["instances"]) == 1


@pytest.mark.parametrize(
    "fault",
    [{"op": "create", "kind": "500"}, {"op": "create", "kind": "429", "retry_after": 1}],
    ids=["500", "429"],
)
def test_vendor_failures_become_retryable_errors_and_create_nothing(
    fake: FakeVastAI, tmp_path: Path, fault: dict[str, object]
) -> None:
    fake.add_faults([fault])
    with pytest.raises(ProviderUnavailable) as caught:
        provider_for(fake, tmp_path).launch(LaunchRequest("tf-r4-1", "r4", SECTION))
    assert caught.value.retryable
    assert fake.state()["instances"] == []


def test_a_spent_search_quota_says_when_to_try_again(fake: FakeVastAI, tmp_path: Path) -> None:
    fake.add_faults([{"op": "search", "kind": "quota", "retry_after": 42}])
    with pytest.raises(ProviderUnavailable, match="search quota exceeded") as caught:
        provider_for(fake, tmp_path).list_offers(SECTION)
    assert caught.value.retryable and caught.value.retry_after == 42
    assert fake.state()["requests"]["search"] == 1  # the library gave up at once, as vast.ai asks
    assert [o.offer_id for o in provider_for(fake, tmp_path).list_offers(SECTION)] == ["1001"]


def test_no_capacity_and_bad_key(fake: FakeVastAI, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    stale = provider.client.search_offers  # an offer that is gone between the search and the create
    offers = stale({"gpu_name": {"eq": "RTX A5000"}}, bid=True)
    fake.offers[1001].update(rentable=False)
    with pytest.raises(NoCapacity):
        provider.launch(LaunchRequest("tf-r5-1", "r5", SECTION))  # nothing fits any more
    provider.client.search_offers = lambda query, bid: offers  # type: ignore[method-assign]
    with pytest.raises(NoCapacity, match="no longer available"):
        provider.launch(LaunchRequest("tf-r5-1", "r5", SECTION))  # vast.ai answers no_such_ask
    assert fake.state()["instances"] == []

    with pytest.raises(AuthFailed) as caught:
        provider_for(fake, tmp_path, key="wrong-key-4567").list_instances()
    assert "wrong-key-4567" not in str(caught.value) and KEY not in str(caught.value)


def test_terminate_is_idempotent_even_when_the_vendor_says_not_found(
    fake: FakeVastAI, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(LaunchRequest("tf-r6-1", "r6", SECTION))
    assert provider.tokens.get("tf-r6-1") is not None
    fake.add_faults([{"op": "terminate", "kind": "not_found"}])
    provider.terminate("tf-r6-1")  # the vendor says "not found": nothing to do, no error
    provider.terminate("tf-r6-1")
    assert fake.state()["instances"] == [] and provider.gone("tf-r6-1", fresh=True)
    assert provider.tokens.get("tf-r6-1") is not None  # kept until the fleet knows it went...
    provider.forget("tf-r6-1")
    assert provider.tokens.get("tf-r6-1") is None  # ...then dropped
    provider.terminate("tf-never-1")
    assert provider.get("tf-never-1") is None and provider.list_instances() == []


def test_the_node_destroys_itself_at_its_deadline(fake: FakeVastAI, tmp_path: Path) -> None:
    """The instance's real start script, run as vast.ai would run it (a stand-in `ray` that just blocks):
    its failsafe destroys the instance with the instance's own key once terminate_after has passed (the
    heartbeat timeout is longer). No secret is inline."""
    section = SECTION.model_copy(update={"terminate_after": 1})
    secret = SecretStr("hf_node_secret_0123")
    request = LaunchRequest("tf-r9-1", "r9", section, {"HF_TOKEN": secret}, heartbeat_timeout_s=600)
    inst = provider_for(fake, tmp_path).launch(request)
    row = fake.instances[inst.provider_id]
    assert row.env["FLEET_DEADLINE_S"] == "1" and row.env["FLEET_VAST_URL"] == fake.url
    assert row.env["FLEET_HEARTBEAT_TIMEOUT_S"] == "600" and KEY not in row.env.values()
    for value in (KEY, secret.get_secret_value(), row.env["FLEET_RAY_TOKEN"]):
        assert value not in str(row.extra["onstart"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text("#!/bin/sh\nexec sleep 60\n")
    (bin_dir / "ray").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FLEET_NODE_ROOT": str(tmp_path / "root"),
        **row.env,
        **fake.container_env(inst.provider_id),
    }
    node = subprocess.Popen(["sh", "-c", str(row.extra["onstart"])], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while fake.state()["instances"]:
            assert node.poll() is None, "the start script ended early"
            assert time.monotonic() < deadline, "the node did not destroy itself"
            time.sleep(0.2)
        assert fake.state()["requests"].get("terminate") == 1
        assert (tmp_path / "root").is_dir()  # the start script made the node's root for runs
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()


def test_an_instance_key_manages_only_its_own_instance(fake: FakeVastAI, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    one = provider.launch(LaunchRequest("tf-ra-1", "ra", SECTION))
    two = provider.launch(LaunchRequest("tf-rb-1", "rb", SECTION.model_copy(update={"gpu": "RTX_4090"})))
    own_key = fake.container_env(one.provider_id)["CONTAINER_API_KEY"]
    other = requests.delete(
        f"{fake.url}/api/v0/instances/{two.provider_id}/", headers={"Authorization": f"Bearer {own_key}"}
    )
    assert other.status_code == 401
    mine = requests.delete(
        f"{fake.url}/api/v0/instances/{one.provider_id}/", headers={"Authorization": f"Bearer {own_key}"}
    )
    assert mine.status_code == 200
    assert [r["name"] for r in fake.state()["instances"]] == ["tf-rb-1"]


def test_the_paged_list_is_read_whole_its_pages_spaced_like_lists(
    tmp_path: Path, redis_client: redis.Redis[str]
) -> None:
    """vast.ai pages its instance list (25 a request; 2 here): every page is read, and with the fleet's
    shared listing the pages are spaced as lists are (spacing_s), so 200 instances never make a burst."""
    with FakeVastAI(api_key=KEY, home=tmp_path / "fake", nodes="none", page_size=2) as fake:
        for n in range(5):
            fake.add_instance(Instance(str(n + 1), f"tf-r{n}-1", "RTX_A5000", 1, 0.1, None, {}))
        lists = fake.state()["requests"].get("list", 0)
        cache = ListingCache(RedisListings(redis_client), max_age_s=0.01, spacing_s=0.3)
        context = ProviderContext(
            home=tmp_path,
            credentials={"VAST_API_KEY": SecretStr(KEY)},
            urls={"vastai": fake.url},
            listings=cache,
        )
        began = time.monotonic()
        names = sorted(i.name for i in VastAIProvider(context).list_instances())
        took = time.monotonic() - began
        assert names == [f"tf-r{n}-1" for n in range(5)]
        assert fake.state()["requests"]["list"] - lists == 3 and took >= 0.6  # 3 pages, 0.3 s apart
