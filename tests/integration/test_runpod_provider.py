"""The RunPod adapter against the fake RunPod API (no Ray nodes: wire behaviour and error handling)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.errors import AuthFailed, NoCapacity, ProviderUnavailable, ProvisioningFailed
from providers.base import LaunchRequest, NodeState, ProviderContext
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from tests.fakes.runpod import FakeRunPod

pytestmark = pytest.mark.integration
KEY = "rp-test-key"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY, home=tmp_path / "fake", nodes="none", ready_delay_s=0.1) as fake:
        yield fake


def provider_for(fake: FakeRunPod, tmp_path: Path, key: str = KEY) -> RunPodProvider:
    context = ProviderContext(
        home=tmp_path,
        credentials={"RUNPOD_API_KEY": SecretStr(key)},
        urls={"runpod": fake.url},
        clouds={"runpod": RunPodSettings(**fake.proxy.values())},
    )
    return RunPodProvider(context)


SECTION = RunPodSection(gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5, pod_type="INTERRUPTABLE")


def test_offers_fit_the_section_cheapest_first_and_say_why_not(fake: FakeRunPod, tmp_path: Path) -> None:
    choice = provider_for(fake, tmp_path).choose(
        RunPodSection(
            gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.12, cloud_type="ALL", pod_type="INTERRUPTABLE"
        )
    )
    assert [p.candidate.offer_id for p in choice.fits] == ["NVIDIA RTX A5000/COMMUNITY"]
    assert choice.fits[0].bid_per_gpu == 0.11
    why = {r.candidate.offer_id: r.reasons for r in choice.rejected}
    assert "minimum bid $0.130/GPU/h is above max_bid_per_gpu $0.120" in why["NVIDIA RTX A5000/SECURE"]
    assert any("gpu is NVIDIA RTX A6000" in reason for reason in why["NVIDIA RTX A6000/SECURE"])


def test_launch_bids_within_the_cap_and_sets_a_deadline(fake: FakeRunPod, tmp_path: Path) -> None:
    inst = provider_for(fake, tmp_path).launch(LaunchRequest("tf-r1-1", "r1", SECTION))
    (row,) = fake.state()["instances"]
    assert row["name"] == "tf-r1-1" and row["bid"] == 0.13 and inst.price_per_hour == 0.13
    # The node's token travels in its env (by name only here), where its failsafe terminates it, its root
    # (on the pod's volume), and what sets its software up.
    assert row["env_keys"] == [
        "FLEET_NODE_ACCESS", "FLEET_NODE_PINS", "FLEET_NODE_PYTHON_VERSION", "FLEET_NODE_ROOT",
        "FLEET_NODE_SETUP", "FLEET_RAY_TOKEN", "FLEET_RUNPOD_URL",
    ]  # fmt: skip
    pod = fake.instances[str(row["id"])]
    assert pod.extra["terminateAfter"]  # RunPod's own deadline is set
    assert pod.env["FLEET_NODE_ROOT"] == "/content/trainfleet" == f"{pod.extra['volumeMountPath']}/trainfleet"
    assert pod.extra["imageName"] == "rayproject/ray:2.60.0-py311-gpu" and "dockerArgs" in pod.extra


def test_a_template_gives_the_image_and_runs_the_start_script_from_the_environment(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(
        LaunchRequest("tf-t1-1", "t1", SECTION.model_copy(update={"template_id": "tf-bootstrap"}))
    )
    (pod,) = fake.instances.values()
    assert pod.extra["templateId"] == "tf-bootstrap" and "dockerArgs" not in pod.extra
    assert pod.extra["imageName"] == "rayproject/ray:2.60.0-py311-gpu"  # the template's, not ours
    assert (
        pod.env["FLEET_BOOTSTRAP"].startswith("set -eu\n")
        and "fleet_ray ray start --head" in pod.env["FLEET_BOOTSTRAP"]
    )
    assert not pod.stuck  # that template runs it: the node boots
    # A template and an image: the image and our start command, as without a template.
    provider.launch(
        LaunchRequest(
            "tf-t2-1", "t2", SECTION.model_copy(update={"template_id": "758uq6u5fc", "image": "img:1"})
        )
    )
    (second,) = [p for p in fake.instances.values() if p.name == "tf-t2-1"]
    assert second.extra["imageName"] == "img:1" and "dockerArgs" in second.extra
    assert "FLEET_BOOTSTRAP" not in second.env and not second.stuck
    # The proof of concept's template runs its own start command: without an image, no Ray ever comes up.
    provider.launch(LaunchRequest("tf-t3-1", "t3", SECTION.model_copy(update={"template_id": "758uq6u5fc"})))
    (third,) = [p for p in fake.instances.values() if p.name == "tf-t3-1"]
    assert third.stuck and third.extra["imageName"].startswith("winglian/axolotl-runpod")


def test_error_after_create_leaves_exactly_one_instance(fake: FakeRunPod, tmp_path: Path) -> None:
    fake.add_faults([{"op": "create", "kind": "error_after_create"}])
    provider = provider_for(fake, tmp_path)
    inst = provider.launch(LaunchRequest("tf-r2-1", "r2", SECTION))
    assert inst.name == "tf-r2-1"
    assert [r["name"] for r in fake.state()["instances"]] == ["tf-r2-1"]
    provider.terminate("tf-r2-1")
    assert fake.state()["instances"] == [] and provider.get("tf-r2-1") is None


def test_a_launch_says_whether_it_surely_made_nothing(fake: FakeRunPod, tmp_path: Path) -> None:
    """A failed launch's error says whether a create may be asked again at once (made_nothing) or the pod
    may exist (the provision stage then looks it up by name before any other create)."""
    provider = provider_for(fake, tmp_path)
    fake.add_faults([{"op": "search", "kind": "500"}])  # before any create call: nothing made
    with pytest.raises(ProviderUnavailable) as search:
        provider.launch(LaunchRequest("tf-r5-1", "r5", SECTION))
    assert search.value.made_nothing and fake.state()["requests"].get("create", 0) == 0
    # A 429 saying when: a clear no, told as such even though the list would fail now (no lookup needed).
    fake.add_faults([{"op": "create", "kind": "429", "retry_after": 1}, {"op": "list", "kind": "500"}])
    with pytest.raises(ProviderUnavailable) as limited:
        provider.launch(LaunchRequest("tf-r5-1", "r5", SECTION))
    assert limited.value.made_nothing and limited.value.retry_after == 1
    assert fake.state()["requests"].get("list", 0) == 0
    # A 500 may have made the pod: looked up by name (the lookup meets the list's 500 still queued), so
    # the error says it may exist; and again with the lookup answered: not there (yet).
    for looks in (1, 2):
        fake.add_faults([{"op": "create", "kind": "500"}])
        with pytest.raises(ProviderUnavailable) as unclear:
            provider.launch(LaunchRequest("tf-r5-1", "r5", SECTION))
        assert not unclear.value.made_nothing and fake.state()["requests"]["list"] == looks
    assert fake.state()["instances"] == []


def test_a_duplicate_under_one_name_is_terminated(fake: FakeRunPod, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(LaunchRequest("tf-r3-1", "r3", SECTION))
    provider.client.rent_interruptable(  # as if a retried create had gone through twice
        {
            "name": "tf-r3-1",
            "imageName": "img",
            "gpuTypeId": "NVIDIA RTX A5000",
            "gpuCount": 1,
            "bidPerGpu": 0.13,
        }
    )
    assert len(fake.state()["instances"]) == 2
    assert provider.get("tf-r3-1") is not None
    assert len(fake.state()["instances"]) == 1


def test_a_clusters_pods_share_a_private_network_a_volume_and_the_heads_token(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    fake.add_network_volume("vol-1")
    section = RunPodSection(
        gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5, num_nodes=2, network_volume_id="vol-1"
    )
    provider = provider_for(fake, tmp_path)
    head = provider.launch(LaunchRequest("tf-r9-1-0", "r9", section))
    with pytest.raises(ProvisioningFailed, match="tf-r9-2-0 is not there to join"):
        provider.launch(LaunchRequest("tf-r9-2-1", "r9", section, head="tf-r9-2-0"))
    worker = provider.launch(LaunchRequest("tf-r9-1-1", "r9", section, head="tf-r9-1-0"))
    pods = {i.name: i for i in fake.instances.values()}
    for pod in pods.values():
        assert pod.extra["globalNetwork"] is True and pod.extra["networkVolumeId"] == "vol-1"
        assert "volumeInGb" not in pod.extra  # the network volume takes the pod volume's place
        assert pod.env["FLEET_NODE_ROOT"] == "/content/trainfleet"  # the runs live on the volume
    head_pod, worker_pod = pods["tf-r9-1-0"], pods["tf-r9-1-1"]
    assert "FLEET_RAY_HEAD_ADDRESS" not in head_pod.env and "--head" in head_pod.extra["dockerArgs"]
    assert worker_pod.env["FLEET_RAY_HEAD_ADDRESS"] == f"{head.provider_id}.runpod.internal:6379"
    assert worker_pod.env["FLEET_RAY_TOKEN"] == head_pod.env["FLEET_RAY_TOKEN"]  # Ray lets only it join
    assert "--address=" in worker_pod.extra["dockerArgs"] and "--head" not in worker_pod.extra["dockerArgs"]
    assert "RUNPOD_POD_ID.runpod.internal" in worker_pod.extra["dockerArgs"]  # it advertises its private IP
    assert provider.tokens.head_of("tf-r9-1-1") == "tf-r9-1-0" and worker.provider_id == worker_pod.id

    # Nothing answers a Jobs API here: the head stays PENDING, but a worker node serves none, so it is up
    # as soon as its container runs (whether it joined is the head's cluster to say).
    wait = time.monotonic() + 10
    while provider.get("tf-r9-1-1").state != NodeState.RUNNING:  # type: ignore[union-attr]
        assert time.monotonic() < wait, "the worker pod never came up"
        time.sleep(0.05)
    assert provider.get("tf-r9-1-0").state == NodeState.PENDING  # type: ignore[union-attr]
    for name in ("tf-r9-1-0", "tf-r9-1-1"):
        provider.terminate(name)
        assert provider.gone(name, fresh=True)  # the vendor's list, asked after the terminate
        provider.forget(name)  # what the fleet does once it knows
    assert fake.state()["instances"] == [] and provider.tokens.head_of("tf-r9-1-1") is None


@pytest.mark.parametrize(
    ("fault", "retry_after"),
    [({"op": "create", "kind": "500"}, None), ({"op": "create", "kind": "429", "retry_after": 7}, 7)],
)
def test_vendor_failures_become_retryable_errors_and_create_nothing(
    fake: FakeRunPod, tmp_path: Path, fault: dict[str, object], retry_after: float | None
) -> None:
    fake.add_faults([fault])
    with pytest.raises(ProviderUnavailable) as caught:
        provider_for(fake, tmp_path).launch(LaunchRequest("tf-r4-1", "r4", SECTION))
    assert caught.value.retryable and caught.value.retry_after == retry_after  # a stated wait is kept
    assert fake.state()["instances"] == []


def test_no_capacity_and_bad_key(fake: FakeRunPod, tmp_path: Path) -> None:
    fake.set_stock("NVIDIA RTX A5000", 0)
    with pytest.raises(NoCapacity):
        provider_for(fake, tmp_path).launch(LaunchRequest("tf-r5-1", "r5", SECTION))
    with pytest.raises(AuthFailed) as caught:
        provider_for(fake, tmp_path, key="wrong-key").list_instances()
    assert "wrong-key" not in str(caught.value)


def test_terminate_is_idempotent_even_when_the_vendor_says_not_found(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(LaunchRequest("tf-r6-1", "r6", SECTION))
    fake.add_faults([{"op": "terminate", "kind": "not_found"}])
    provider.terminate("tf-r6-1")  # the vendor says "not found": nothing to do, no error
    provider.terminate("tf-r6-1")
    assert fake.state()["instances"] == []
    provider.terminate("tf-never-1")
    assert provider.get("tf-never-1") is None


def test_the_pod_terminates_itself_when_the_fleet_is_silent(fake: FakeRunPod, tmp_path: Path) -> None:
    """The pod's real container command, run as RunPod would run it (a stand-in `ray` that just blocks):
    its failsafe hears no heartbeat and terminates the pod with the pod's own key. No secret is inline."""
    secret = SecretStr("hf_node_secret_0123")
    request = LaunchRequest("tf-r9-1", "r9", SECTION, {"HF_TOKEN": secret}, heartbeat_timeout_s=1)
    pod = provider_for(fake, tmp_path).launch(request)
    row = fake.instances[pod.provider_id]
    assert row.env["FLEET_HEARTBEAT_TIMEOUT_S"] == "1" and row.env["FLEET_RUNPOD_URL"] == fake.url
    docker_args = str(row.extra["dockerArgs"])
    assert KEY not in row.env.values()
    for value in (KEY, secret.get_secret_value(), row.env["FLEET_RAY_TOKEN"]):
        assert value not in docker_args
    node = start_node(tmp_path, shlex.split(docker_args), {**row.env, **fake.container_env(pod.provider_id)})
    try:
        deadline = time.monotonic() + 15
        while fake.state()["instances"]:
            assert node.poll() is None, "the container command ended early"
            assert time.monotonic() < deadline, "the pod did not terminate itself"
            time.sleep(0.2)
        assert fake.state()["requests"].get("terminate") == 1
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()


def start_node(tmp_path: Path, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A container's command with a stand-in `ray` that just blocks, and this Python as `python3`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text("#!/bin/sh\nexec sleep 60\n")
    (bin_dir / "ray").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FLEET_NODE_ROOT": str(tmp_path / "root"), **env}
    return subprocess.Popen(argv, env=env, start_new_session=True)


def test_fleet_offers_shows_fits_and_why_not(fake: FakeRunPod, tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from fleet.cli import cli
    from tests.factories import EXAMPLE_YAML, copy_example_data

    job = tmp_path / "job.yml"
    section = "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.12\n  cloud_type: ALL\n"
    section += "  pod_type: INTERRUPTABLE\n"
    one_per_gpu = EXAMPLE_YAML.read_text().replace("ray_num_workers: 2\n", "")  # (two need two GPUs)
    job.write_text(one_per_gpu.replace("local:\n  one_shot: true\n", section))
    copy_example_data(tmp_path)
    env = {
        "RUNPOD_API_BASE_URL": fake.url,
        "RUNPOD_API_KEY": KEY,
        "FLEET_HOME": str(tmp_path / "home"),
        "FLEET_SETTINGS_FILE": str(tmp_path / "none.yml"),
        "FLEET_SECRETS_FILE": str(tmp_path / "no-secrets.yml"),
    }
    (tmp_path / "none.yml").write_text("{}\n")
    result = CliRunner().invoke(cli, ["offers", str(job), "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert [f["offer"] for f in shown["fits"]] == ["NVIDIA RTX A5000/COMMUNITY"]
    assert shown["fits"][0]["bid_per_gpu"] == 0.11
    why = {r["offer"]: r["why"] for r in shown["rejected"]}
    assert any("above max_bid_per_gpu" in w for w in why["NVIDIA RTX A5000/SECURE"])
