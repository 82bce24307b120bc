"""providers.ssh.provider against real sshd servers (tests/sshd.py) and the session's real Redis: a node on
a pool machine launched, reached through the fleet's tunnel with its token, holding the machine against a
second run, and given back clean; a two-machine cluster; a machine that is down passed over and named; a
host key that changed refused with why."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from core.errors import MachinesHeld, NoCapacity, ProvisioningFailed
from providers.base import LaunchRequest, NodeState, ProviderContext
from providers.cluster import cluster_nodes
from providers.node import ping
from providers.onnode import failsafe
from providers.ssh.claims import Claims
from providers.ssh.connect import Connection
from providers.ssh.node import running
from providers.ssh.provider import SshProvider
from providers.ssh.section import SshSection
from providers.ssh.settings import SshSettings
from tests.sshd import Sshd, free_port, keypair, start_sshd

pytestmark = pytest.mark.integration
READY_S = 300  # the first node of a session installs the node's software into the pool user's venv


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Sshd]]:
    started = [start_sshd(tmp_path / "one"), start_sshd(tmp_path / "two")]
    yield started
    for server in started:
        server.stop()


def _machine(server: Sshd, host_key: str | None = None, port: int | None = None) -> str:
    key = host_key or server.host_key
    return (
        f"      - {{host: 127.0.0.1, port: {port or server.port}, user: {server.user}, key: {server.key}, "
        f'host_key: "{key}", hourly_usd: 0.25}}\n'
    )


def _provider(tmp_path: Path, client: redis.Redis[str], pools: dict[str, list[str]]) -> SshProvider:
    text = "pools:\n" + "".join(f"  {name}:\n    machines:\n" + "".join(ms) for name, ms in pools.items())
    (tmp_path / "pools.yml").write_text(text)
    own = SshSettings(ssh_pools_file=tmp_path / "pools.yml", ssh_known_hosts=tmp_path / "none")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return SshProvider(ProviderContext(home=home, clouds={"ssh": own}, client=client))


def _request(name: str, pool: str, nodes: int = 1, head: str | None = None) -> LaunchRequest:
    run = name.split("-")[1]
    return LaunchRequest(name, run, SshSection(pool=pool, gpu_count=0, num_nodes=nodes), head=head)


def _wait_running(provider: SshProvider, name: str) -> None:
    deadline = time.monotonic() + READY_S
    while (found := provider.get(name)) is None or found.state != NodeState.RUNNING:
        assert found is None or found.state != NodeState.FAILED, found.message
        assert time.monotonic() < deadline, f"{name} not up after {READY_S} s: {found}"
        time.sleep(1)


def test_a_run_holds_its_machine_reaches_its_head_and_gives_the_machine_back_clean(
    tmp_path: Path, redis_client: redis.Redis[str], servers: list[Sshd]
) -> None:
    provider = _provider(tmp_path, redis_client, {"solo": [_machine(servers[0])]})
    launched = provider.launch(_request("tf-one-1", "solo"))
    assert (launched.state, launched.price_per_hour) == (NodeState.PENDING, 0.25)
    try:
        with pytest.raises(MachinesHeld, match="held by one"):  # a second run waits for the machine
            provider.launch(_request("tf-two-1", "solo"))
        _wait_running(provider, "tf-one-1")
        endpoint = provider.endpoint("tf-one-1")
        assert endpoint.jobs_url.startswith("http://127.0.0.1:")  # this process's tunnel
        assert httpx.get(f"{endpoint.jobs_url}/api/version", headers=endpoint.headers).status_code == 200
        assert httpx.get(f"{endpoint.jobs_url}/api/version").status_code in (401, 403)  # the token is needed
        listed = {i.name: i.state for i in provider.list_instances()}
        assert listed == {"tf-one-1": NodeState.RUNNING}
        node = Claims(redis_client).held("solo")[servers[0].machine().name].node
        assert node is not None
        # The fleet's calls through the tunnel are heartbeats as a node's failsafe reads them: the log of
        # the node's dashboard on the machine shows the ping as one.
        assert ping(endpoint)
        with Connection(servers[0].machine(), servers[0].known_hosts) as ssh:
            logged = ssh.run(f"cat {node.temp_dir}/session_latest/logs/dashboard.log").stdout
        assert any(failsafe.is_heartbeat(line) for line in logged.splitlines()), logged[-2000:]
    finally:
        provider.terminate("tf-one-1")
    assert provider.gone("tf-one-1") and provider.get("tf-one-1") is None
    with Connection(servers[0].machine(), servers[0].known_hosts) as ssh:
        assert not running(ssh, node)
        assert ssh.run(f"test -e {node.home} || test -e {node.temp_dir}").status == 1
    provider.terminate("tf-one-1")  # again: nothing to do
    assert provider.launch(_request("tf-two-1", "solo")).name == "tf-two-1"  # the machine is free again
    provider.terminate("tf-two-1")


def test_a_cluster_s_nodes_each_hold_a_machine_and_join_the_head(
    tmp_path: Path, redis_client: redis.Redis[str], servers: list[Sshd]
) -> None:
    provider = _provider(tmp_path, redis_client, {"lab": [_machine(s) for s in servers]})
    provider.launch(_request("tf-pair-1-0", "lab", nodes=2))
    claims = Claims(redis_client).held("lab")
    assert sorted(c.instance for c in claims.values()) == ["tf-pair-1-0", "tf-pair-1-1"]  # both, at once
    assert provider.get("tf-pair-1-1") is None  # claimed with its head, not started yet
    try:
        provider.launch(_request("tf-pair-1-1", "lab", nodes=2, head="tf-pair-1-0"))
        _wait_running(provider, "tf-pair-1-0")
        endpoint = provider.endpoint("tf-pair-1-0")
        deadline = time.monotonic() + READY_S
        while len([n for n in cluster_nodes(endpoint) if n.state == "ALIVE"]) < 2:
            assert time.monotonic() < deadline, "the second machine's node never joined"
            time.sleep(1)
    finally:
        provider.terminate("tf-pair-1-1")
        provider.terminate("tf-pair-1-0")
    assert Claims(redis_client).held("lab") == {}


def test_a_machine_that_is_down_is_passed_over_then_named_when_none_is_left(
    tmp_path: Path, redis_client: redis.Redis[str], servers: list[Sshd]
) -> None:
    down = free_port()  # nothing listens there
    provider = _provider(
        tmp_path, redis_client, {"lab": [_machine(servers[0], port=down), _machine(servers[0])]}
    )
    launched = provider.launch(_request("tf-moved-1", "lab"))
    assert launched.provider_id == servers[0].machine().name  # the second machine: the first is down
    provider.terminate("tf-moved-1")
    only = _provider(tmp_path, redis_client, {"lab": [_machine(servers[0], port=down)]})
    with pytest.raises(NoCapacity, match=rf"127.0.0.1:{down}: no SSH connection \(connection refused\)"):
        only.launch(_request("tf-moved-2", "lab"))
    assert Claims(redis_client).held("lab") == {}  # nothing claimed


def test_a_changed_host_key_is_refused_with_why(
    tmp_path: Path, redis_client: redis.Redis[str], servers: list[Sshd]
) -> None:
    other = keypair(tmp_path / "another_host_key")
    provider = _provider(tmp_path, redis_client, {"lab": [_machine(servers[0], host_key=other)]})
    with pytest.raises(ProvisioningFailed, match="its host key changed") as refused:
        provider.launch(_request("tf-mitm-1", "lab"))
    assert refused.value.made_nothing
    assert Claims(redis_client).held("lab") == {}


def test_a_pool_node_the_fleet_stops_hearing_ends_itself(
    tmp_path: Path, redis_client: redis.Redis[str], servers: list[Sshd]
) -> None:
    provider = _provider(tmp_path, redis_client, {"solo": [_machine(servers[0])]})
    provider.launch(dataclasses.replace(_request("tf-alone-1", "solo"), heartbeat_timeout_s=5.0))
    node = Claims(redis_client).held("solo")[servers[0].machine().name].node
    assert node is not None
    try:
        deadline = time.monotonic() + 120  # no heartbeat for 5 s: SIGTERM, then SIGKILL after 10 s
        while (found := provider.get("tf-alone-1")) is not None and found.state != NodeState.FAILED:
            assert time.monotonic() < deadline, f"the node still runs: {found}"
            time.sleep(1)
        with Connection(servers[0].machine(), servers[0].known_hosts) as ssh:
            # Its start shell went first (SIGTERM): what else of it is left gets SIGKILL 10 s later.
            gone = time.monotonic() + 30
            while running(ssh, node):
                assert time.monotonic() < gone, "processes of the node outlived its failsafe"
                time.sleep(0.5)
            said = ssh.run(f"cat {node.home}/node.log").stdout
            assert "no heartbeat" in said and "giving this ssh instance back" in said, said[-2000:]
    finally:
        provider.terminate("tf-alone-1")  # the fleet, back: the machine is given back to its pool
    assert Claims(redis_client).held("solo") == {}
