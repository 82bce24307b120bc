"""The ways into a node, from the vendors' records: where SSH and JupyterLab are published, what a create
call asks for, the ssh command `fleet ssh` prints, and what it says when there is no way in."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from core.errors import NodeError
from providers.base import LaunchRequest, ProviderContext, SshAccess
from providers.local.provider import LocalProvider
from providers.runpod.models import RunPodPod
from providers.runpod.provider import RunPodProvider, pod_ports
from providers.runpod.section import RunPodSection
from providers.vastai.models import VastInstance
from providers.vastai.provider import VastAIProvider
from service.nodeaccess import SshCommand

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAABAgMEBQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4f me@laptop"
DASHBOARD = {
    "ip": "203.0.113.7",
    "isIpPublic": True,
    "privatePort": 8265,
    "publicPort": 41265,
    "type": "http",
}


def context(tmp_path: Path, key: str | None = KEY) -> ProviderContext:
    credentials = {"RUNPOD_API_KEY": SecretStr("rp"), "VAST_API_KEY": SecretStr("va")}
    urls = {"runpod": "http://127.0.0.1:9", "vastai": "http://127.0.0.1:9"}
    return ProviderContext(home=tmp_path, credentials=credentials, urls=urls, ssh_public_key=key)


def runpod(tmp_path: Path, pods: list[dict[str, Any]], key: str | None = KEY) -> RunPodProvider:
    """A RunPod provider whose vendor lists `pods` (RunPod's wire shape), and nothing else."""
    provider = RunPodProvider(context(tmp_path, key))
    records = [RunPodPod.model_validate(p) for p in pods]
    provider._records = lambda name=None: [r for r in records if name in (None, r.name)]  # type: ignore[method-assign]
    return provider


def pod(*ports: dict[str, Any], name: str = "tf-r1-1") -> dict[str, Any]:
    runtime = {"uptimeInSeconds": 60, "ports": list(ports)} if ports else None
    return {"id": "pod123", "name": name, "desiredStatus": "RUNNING", "costPerHr": 0.2, "runtime": runtime}


def test_the_ssh_command_names_port_user_host_and_the_identity_only_when_there_is_one() -> None:
    plain = SshCommand("tf-r1-1", "runpod", SshAccess("203.0.113.7", 40022))
    assert plain.argv() == ["ssh", "-p", "40022", "root@203.0.113.7"]
    assert plain.text() == "ssh -p 40022 root@203.0.113.7"
    keyed = SshCommand("tf-r1-1", "runpod", SshAccess("h", 22), Path("/home/me/.ssh/my key"))
    assert keyed.text() == "ssh -p 22 -i '/home/me/.ssh/my key' root@h"
    assert keyed.view() | {"command": ""} == {
        "instance": "tf-r1-1", "provider": "runpod", "host": "h", "port": 22, "user": "root",
        "identity_file": "/home/me/.ssh/my key", "command": "",
    }  # fmt: skip


def test_a_pod_publishes_ssh_and_jupyter_only_when_asked() -> None:
    assert pod_ports({}) == "8265/http"
    assert pod_ports({"PUBLIC_KEY": KEY}) == "8265/http,22/tcp"
    assert pod_ports({"PUBLIC_KEY": KEY, "FLEET_JUPYTER_TOKEN": "t"}) == "8265/http,8888/http,22/tcp"


def test_the_create_env_carries_the_key_on_every_node_and_a_jupyter_token_on_the_head(tmp_path: Path) -> None:
    provider = runpod(tmp_path, [])
    section = RunPodSection(jupyter=True, num_nodes=2, network_volume_id="vol-1")
    head = provider._access_env(LaunchRequest("tf-r1-1-0", "r1", section), section)
    worker = provider._access_env(LaunchRequest("tf-r1-1-1", "r1", section, head="tf-r1-1-0"), section)
    assert head == {"PUBLIC_KEY": KEY, "FLEET_JUPYTER_TOKEN": provider.tokens.jupyter("tf-r1-1-0")}
    assert len(head["FLEET_JUPYTER_TOKEN"]) >= 40 and worker == {"PUBLIC_KEY": KEY}
    again = provider._access_env(LaunchRequest("tf-r1-1-0", "r1", section), section)
    assert again == head  # a relaunch under the same name keeps its token
    assert (tmp_path / "secrets" / "nodes" / "tf-r1-1-0.jupyter").stat().st_mode & 0o077 == 0
    plain = runpod(tmp_path, [], key=None)
    assert plain._access_env(LaunchRequest("tf-r2-1", "r2", RunPodSection()), RunPodSection()) == {}


def test_runpod_ssh_is_its_public_tcp_mapping_of_port_22(tmp_path: Path) -> None:
    ssh = {"ip": "203.0.113.7", "isIpPublic": True, "privatePort": 22, "publicPort": 40022, "type": "tcp"}
    assert runpod(tmp_path, [pod(DASHBOARD, ssh)]).ssh_access("tf-r1-1") == SshAccess("203.0.113.7", 40022)


@pytest.mark.parametrize(
    ("pods", "needle"),
    [
        ([], "instance tf-r1-1 is gone: RunPod no longer lists it"),
        ([pod()], "instance tf-r1-1 is pending (starting): try again once it is up"),
        ([pod(DASHBOARD)], "has no SSH: set the fleet's ssh_public_key"),
    ],
)
def test_runpod_says_why_there_is_no_ssh(tmp_path: Path, pods: list[dict[str, Any]], needle: str) -> None:
    with pytest.raises(NodeError, match=re.escape(needle)):
        runpod(tmp_path, pods).ssh_access("tf-r1-1")


def test_runpod_jupyter_is_behind_its_proxy_with_the_nodes_own_token(tmp_path: Path) -> None:
    jupyter = {
        "ip": "100.65.0.2",
        "isIpPublic": False,
        "privatePort": 8888,
        "publicPort": 8888,
        "type": "http",
    }
    provider = runpod(tmp_path, [pod(DASHBOARD, jupyter)])
    with pytest.raises(NodeError, match="runs no JupyterLab: set `jupyter: true`"):
        provider.jupyter_url("tf-r1-1")
    token = provider.tokens.ensure_jupyter("tf-r1-1")
    assert provider.jupyter_url("tf-r1-1") == f"https://pod123-8888.proxy.runpod.net/lab?token={token}"


def vast_row(**fields: Any) -> VastInstance:
    ports = {"8265/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41265"}], **fields.pop("ports", {})}
    base = {"id": 7, "label": "tf-r1-1", "actual_status": "running", "public_ipaddr": "198.51.100.4 "}
    return VastInstance.model_validate(base | {"ports": ports} | fields)


def test_vast_ssh_is_direct_first_then_its_proxy(tmp_path: Path) -> None:
    provider = VastAIProvider(context(tmp_path))
    direct = vast_row(ports={"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "40022"}]}, ssh_host="ssh4.vast.ai")
    assert provider._ssh(direct) == SshAccess("198.51.100.4", 40022)
    proxied = vast_row(ssh_host="ssh4.vast.ai", ssh_port=20007)
    assert provider._ssh(proxied) == SshAccess("ssh4.vast.ai", 20007)
    assert provider._ssh(vast_row()) is None
    jupyter = vast_row(ports={"8888/tcp": [{"HostIp": "0.0.0.0", "HostPort": "48888"}]})
    assert provider._published(jupyter, 8888) == "http://198.51.100.4:48888"
    assert provider._jupyter_url(jupyter) == "https://198.51.100.4:48888"  # JupyterLab's TLS front
    assert provider._jobs_url(jupyter) == "https://198.51.100.4:41265"  # its TLS front, never plain HTTP


def test_a_local_node_is_this_machine(tmp_path: Path) -> None:
    with pytest.raises(NodeError, match="a Ray head on this machine: no SSH needed"):
        LocalProvider(ProviderContext(home=tmp_path)).ssh_access("tf-r1-1")
