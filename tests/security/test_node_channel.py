"""Finding 4: the fleet reaches a rented node only over an encrypted, authenticated channel.

Plain HTTP to a public address is refused in code; a vast.ai node's Jobs API port speaks TLS only, with a
certificate the fleet made for that node and pins (another certificate, a man in the middle's, is refused);
a RunPod pod is reached through RunPod's HTTPS proxy, never on its public IP.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import SecretStr

from core.errors import NodeError
from providers.base import LaunchRequest, NodeEndpoint, NodeState, ProviderContext
from providers.bootstrap import start_script
from providers.node import NodeClient, ping
from providers.remote import RemoteProvider
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.tokens import NodeTokens
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI

KEY = "channel-test-key"
TOKEN = "a" * 64


@pytest.fixture
def vast(tmp_path: Path) -> Iterator[tuple[FakeVastAI, VastAIProvider]]:
    with FakeVastAI(api_key=KEY, home=tmp_path / "fake", nodes="stub", ready_delay_s=0.1) as fake:
        context = ProviderContext(
            home=tmp_path / "fleet", credentials={"VAST_API_KEY": SecretStr(KEY)}, urls={"vastai": fake.url}
        )
        yield fake, VastAIProvider(context)


def _running(provider: RemoteProvider, name: str) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        node = provider.get(name)
        if node is not None and node.state == NodeState.RUNNING:
            return
        time.sleep(0.1)
    raise AssertionError(f"{name} never came up")


def test_plain_http_to_a_public_address_is_refused_before_any_connection() -> None:
    public = NodeEndpoint("http://203.0.113.7:8265", "http://203.0.113.7:8265", {"Authorization": "Bearer x"})
    with pytest.raises(NodeError, match=r"refusing plain HTTP to http://203\.0\.113\.7:8265"):
        ping(public, timeout_s=1)
    with pytest.raises(NodeError, match="refusing plain HTTP"):
        NodeClient(public)


def test_a_vast_node_speaks_tls_only_with_the_pinned_certificate(
    vast: tuple[FakeVastAI, VastAIProvider], tmp_path: Path
) -> None:
    fake, provider = vast
    section = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5)
    provider.launch(LaunchRequest("tf-tls-1", "tls", section))
    _running(provider, "tf-tls-1")  # its readiness probe went over the pinned channel
    endpoint = provider.endpoint("tf-tls-1")
    parts = urlsplit(endpoint.jobs_url)
    assert parts.scheme == "https" and endpoint.tls_pin is not None and ping(endpoint)
    # The node got its certificate and key in its environment; the fleet keeps both, owner-only.
    (inst,) = fake.instances.values()
    assert {"FLEET_NODE_TLS_CERT", "FLEET_NODE_TLS_KEY"} <= set(inst.env)
    assert endpoint.tls_pin.stat().st_mode & 0o077 == 0

    # The port answers no plain HTTP: a token sent in clear gets nothing back.
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(
            f"GET /api/version HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        sock.settimeout(5)
        try:
            answer = sock.recv(4096)
        except (ConnectionResetError, TimeoutError):
            answer = b""
    assert not answer.startswith(b"HTTP/")

    # A man in the middle (another certificate at that address): the fleet's client refuses it.
    other = NodeTokens(tmp_path / "elsewhere")
    other.ensure_tls("tf-mitm-1")
    wrong = other.tls_pin("tf-mitm-1")
    impostor = NodeEndpoint(endpoint.jobs_url, endpoint.dashboard_url, endpoint.headers, tls_pin=wrong)
    assert not ping(impostor)
    with pytest.raises(NodeError, match="does not answer"):
        NodeClient(impostor)


def test_runpod_is_reached_through_its_https_proxy_never_its_public_ip(tmp_path: Path) -> None:
    with FakeRunPod(api_key=KEY, home=tmp_path / "fake", nodes="stub", ready_delay_s=0.1) as fake:
        context = ProviderContext(
            home=tmp_path / "fleet",
            credentials={"RUNPOD_API_KEY": SecretStr(KEY)},
            urls={"runpod": fake.url},
            clouds={"runpod": RunPodSettings(**fake.proxy.values())},
        )
        provider = RunPodProvider(context)
        provider.launch(LaunchRequest("tf-rp-1", "rp", RunPodSection(gpu="NVIDIA RTX A5000")))
        _running(provider, "tf-rp-1")
        endpoint = provider.endpoint("tf-rp-1")
        (pod,) = fake.instances.values()
        # The fake publishes the dashboard on a "public IP" too; the fleet does not use it.
        assert endpoint.jobs_url == fake.proxy.url_template.format(pod_id=pod.id, port=8265)
        assert endpoint.jobs_url.startswith("https://") and endpoint.tls_pin is None
        assert ping(endpoint)
        # The proxy's certificate is checked: without the authority that vouches for it, no answer.
        unvouched = NodeEndpoint(endpoint.jobs_url, endpoint.jobs_url, endpoint.headers)
        assert not ping(unvouched)


def test_a_tls_node_start_script_keeps_the_dashboard_on_loopback_and_the_key_out_of_reach() -> None:
    script = start_script(tls=True)
    assert "--dashboard-host=127.0.0.1" in script and "--dashboard-host=0.0.0.0" not in script
    unset = script.index("unset FLEET_NODE_TLS_CERT FLEET_NODE_TLS_KEY")
    assert unset < script.index("FLEET_NODE_SETUP") and unset < script.index("ray start")
