"""The provider contract, run against every provider that exists: local, the clouds with their fakes, the
operator's own machines as two real sshd (tests/sshd.py). Real processes: every instance is a real Ray
head with token auth."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from core.errors import NodeError
from jobs.sections import ProviderName
from jobs.sections.local import LocalSection
from providers.base import LaunchRequest, NodeEndpoint, NodeState, Provider, ProviderContext
from providers.node import channel
from providers.registry import PROVIDERS
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.ssh.section import SshSection
from providers.ssh.settings import SshSettings
from providers.vastai.section import VastAISection
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI
from tests.sshd import start_sshd

pytestmark = pytest.mark.integration


def section_for(name: ProviderName) -> BaseModel:
    if name == ProviderName("runpod"):
        return RunPodSection(gpu="NVIDIA RTX A5000", gpu_count=1, max_bid_per_gpu=0.5)
    if name == ProviderName("vastai"):  # two 1-GPU RTX 4090 offers in the fake, for two instances at once
        return VastAISection(gpu="RTX_4090", cloud_type="ALL", verified_only=False, max_bid_per_gpu=0.5)
    if name == ProviderName("ssh"):  # a pool of two machines, for two instances at once
        return SshSection(pool="lab", gpu_count=0)
    return LocalSection(num_cpus=1)


def pool_of_two(stack: contextlib.ExitStack, tmp_path: Path) -> SshSettings:
    """Two sshd as one pool's machines (their host keys pinned), and the settings that name its file."""
    lines = ""
    for k in range(2):
        server = start_sshd(tmp_path / f"sshd{k}")
        stack.callback(server.stop)
        lines += (
            f"      - {{host: 127.0.0.1, port: {server.port}, user: {server.user}, key: {server.key}, "
            f'host_key: "{server.host_key}"}}\n'
        )
    (tmp_path / "pools.yml").write_text("pools:\n  lab:\n    machines:\n" + lines)
    return SshSettings(ssh_pools_file=tmp_path / "pools.yml", ssh_known_hosts=tmp_path / "none")


@pytest.fixture(params=sorted(PROVIDERS), ids=str)
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Provider]:
    """Each provider, against a fake of its cloud where it has one (a fake's node is a real Ray head)."""
    name = ProviderName(request.param)
    with contextlib.ExitStack() as stack:
        context = ProviderContext(home=tmp_path)
        if name == ProviderName("runpod"):
            fake = stack.enter_context(
                FakeRunPod(api_key="contract-key", home=tmp_path / "fake", nodes="ray")
            )
            context = ProviderContext(
                home=tmp_path,
                credentials={"RUNPOD_API_KEY": SecretStr("contract-key")},
                urls={"runpod": fake.url},
                clouds={"runpod": RunPodSettings(**fake.proxy.values())},
            )
        if name == ProviderName("vastai"):
            vast = stack.enter_context(
                FakeVastAI(api_key="contract-key", home=tmp_path / "fake", nodes="ray")
            )
            context = ProviderContext(
                home=tmp_path,
                credentials={"VAST_API_KEY": SecretStr("contract-key")},
                urls={"vastai": vast.url},
            )
        if name == ProviderName("ssh"):
            client = request.getfixturevalue("redis_client")
            context = ProviderContext(
                home=tmp_path, clouds={"ssh": pool_of_two(stack, tmp_path)}, client=client
            )
        prov = PROVIDERS[name](context)
        yield prov
        for inst in prov.list_instances():
            prov.terminate(inst.name)


def wait_running(provider: Provider, name: str, timeout: float = 60) -> None:
    if provider.name == ProviderName("ssh"):
        timeout = 300  # the first pool node of a session installs the node's software as the pool's user
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        inst = provider.get(name)
        assert inst is not None and inst.state != NodeState.FAILED, inst
        if inst.state == NodeState.RUNNING:
            return
        time.sleep(0.3)
    raise AssertionError(f"{name} not RUNNING after {timeout} s")


def status_of(endpoint: NodeEndpoint, path: str, headers: dict[str, str]) -> int:
    """The status of GET `path` on the node's Jobs API, through the fleet's one channel to a node (TLS with
    the node's pinned certificate, or RunPod's HTTPS proxy), with `headers` only."""
    reply = channel(endpoint).get(f"{endpoint.jobs_url}{path}", headers=headers, timeout=5)
    return int(reply.status_code)


def test_launch_poll_endpoint_terminate(provider: Provider) -> None:
    assert provider.get("tf-c1-1") is None
    started = time.monotonic()
    inst = provider.launch(LaunchRequest("tf-c1-1", "c1", section_for(provider.name)))
    assert time.monotonic() - started < 10  # launch returns at once, it does not wait for readiness
    assert inst.name == "tf-c1-1" and inst.state in (NodeState.PENDING, NodeState.RUNNING)
    wait_running(provider, "tf-c1-1")
    assert [i.name for i in provider.list_instances()] == ["tf-c1-1"]

    endpoint = provider.endpoint("tf-c1-1")
    assert "Bearer" not in repr(endpoint)  # the token never shows in reprs (logs)
    assert status_of(endpoint, "/api/version", endpoint.headers) == 200
    assert status_of(endpoint, "/api/version", {}) == 401  # token auth guards the Jobs API

    provider.terminate("tf-c1-1")
    assert provider.get("tf-c1-1") is None
    assert provider.list_instances() == []
    provider.terminate("tf-c1-1")  # idempotent
    with pytest.raises(NodeError):
        provider.endpoint("tf-c1-1")


def test_terminate_touches_only_its_own_instance(provider: Provider) -> None:
    provider.launch(LaunchRequest("tf-a-1", "a", section_for(provider.name)))
    provider.launch(LaunchRequest("tf-b-1", "b", section_for(provider.name)))
    wait_running(provider, "tf-a-1")
    wait_running(provider, "tf-b-1")
    provider.terminate("tf-a-1")
    assert provider.get("tf-a-1") is None
    survivor = provider.get("tf-b-1")
    assert survivor is not None and survivor.state == NodeState.RUNNING
    endpoint = provider.endpoint("tf-b-1")
    assert status_of(endpoint, "/api/version", endpoint.headers) == 200


def test_refuses_names_that_are_not_ours(provider: Provider) -> None:
    from core.errors import ProvisioningFailed

    with pytest.raises(ProvisioningFailed):
        provider.launch(LaunchRequest("someone-elses", "x", section_for(provider.name)))
    assert provider.list_instances() == []
