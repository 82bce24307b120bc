"""Issue 39, item 4: a job's environment cannot turn off its node's failsafe.

A job's `env` may set proxies and CA bundles for its own downloads (HTTPS_PROXY, ALL_PROXY, SSL_CERT_FILE...),
and they are in the node's environment, which the failsafe shares. The failsafe, run here as the start
script runs it (`python3 -c` with the shipped source), gives its instance back to a fake vast.ai all the
same: straight to the vendor, never through the job's proxy, and over TLS checked against the system's
authorities, never the job's.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from core import envnames
from jobs.sections import ProviderName
from providers.base import LaunchRequest, ProviderContext
from providers.bootstrap import failsafe_argv
from providers.onnode import failsafe
from providers.onnode.tlsfront import Front
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes.tls import localhost_cert
from tests.fakes.vastai import FakeVastAI

KEY = "egress-test-key"
GONE_WITHIN_S = 12.0  # a deadline of 1 s, the failsafe's 1 s poll, one vendor call; the machine is shared
PROXY_NAMES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
# What a job's env may set that urllib, OpenSSL or Python's ssl would read on the failsafe's behalf.
EGRESS_NAMES = (
    *PROXY_NAMES,
    "NO_PROXY",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "SSLKEYLOGFILE",
)


class Swallower:
    """A "proxy" that takes every connection and never answers: a call sent through it never arrives."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.taken: list[socket.socket] = []
        threading.Thread(target=self._take, daemon=True).start()

    def _take(self) -> None:
        while True:
            try:
                self.taken.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.taken:
            conn.close()


class HttpsVendor:
    """The fake vendor over HTTPS at 127.0.0.1, with a certificate of the test's own
    (providers.onnode.tlsfront in front of the fake's plain HTTP, in a thread)."""

    def __init__(self, fake: FakeVastAI, folder: Path) -> None:
        self.cert, key = localhost_cert(folder)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, key)
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        front = Front(int(fake.url.rsplit(":", 1)[1]))
        opening = asyncio.start_server(front.connection, "127.0.0.1", 0, ssl=context)
        self.server = asyncio.run_coroutine_threadsafe(opening, self.loop).result(10)
        self.url = f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def vast(tmp_path: Path) -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=KEY, home=tmp_path / "fake", nodes="none") as fake:
        yield fake


@pytest.fixture
def proxy() -> Iterator[Swallower]:
    swallower = Swallower()
    yield swallower
    swallower.close()


def node_env(vast: FakeVastAI, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A launched instance's id, and its failsafe's environment: the fleet's values and the vendor's, a
    deadline of 1 s, and the rest of this process's environment without its proxies or CA settings."""
    context = ProviderContext(
        home=tmp_path, credentials={"VAST_API_KEY": SecretStr(KEY)}, urls={"vastai": vast.url}
    )
    section = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, terminate_after=-1)
    inst = VastAIProvider(context).launch(LaunchRequest("tf-egress-1", "egress", section))
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_")) and k not in EGRESS_NAMES
    }
    env = {**base, **vast.instances[inst.provider_id].env, **vast.container_env(inst.provider_id)}
    env.update(FLEET_DEADLINE_S="1", FLEET_RAY_TEMP_DIR=str(tmp_path / "no-head"))
    return inst.provider_id, {k: v for k, v in env.items() if k != "FLEET_RAY_TOKEN"}


def alive(vast: FakeVastAI, ident: str) -> bool:
    return any(str(row["id"]) == ident for row in vast.state()["instances"])


def run_failsafe(env: dict[str, str], system_ca: Path | None = None) -> subprocess.Popen[str]:
    """The failsafe as the start script starts it. With `system_ca`, on a machine whose system store (the
    paths OpenSSL was built with) holds that certificate: the test's fake vendor stands in for a real one."""
    argv = failsafe_argv(ProviderName("vastai"))
    argv[0] = sys.executable  # the node's python3
    if system_ca is not None:
        cafile = str(system_ca)
        paths = (
            f"ssl.DefaultVerifyPaths(None, None, 'SSL_CERT_FILE', {cafile!r}, 'SSL_CERT_DIR', '/nonexistent')"
        )
        argv[2] = f"import ssl; ssl.get_default_verify_paths = lambda: {paths}\n{argv[2]}"
    return subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)


def given_back(vast: FakeVastAI, ident: str, proc: subprocess.Popen[str]) -> None:
    """Waits until the instance is gone; fails with the failsafe's stderr after GONE_WITHIN_S."""
    end = time.monotonic() + GONE_WITHIN_S
    while alive(vast, ident):
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"the node was not given back: {proc.communicate(timeout=10)[1]}")
        time.sleep(0.2)
    assert proc.wait(timeout=10) == 0


def test_the_jobs_proxies_do_not_take_the_give_back_elsewhere(
    vast: FakeVastAI, proxy: Swallower, tmp_path: Path
) -> None:
    ident, env = node_env(vast, tmp_path)
    env.update({name: proxy.url for name in PROXY_NAMES})  # NO_PROXY unset: 127.0.0.1 would go through it
    given_back(vast, ident, run_failsafe(env))
    assert proxy.taken == []
    assert vast.state()["requests"]["terminate"] == 1


def test_the_jobs_ca_settings_and_proxies_do_not_stop_a_give_back_over_tls(
    vast: FakeVastAI, proxy: Swallower, tmp_path: Path
) -> None:
    """The vendor over HTTPS, trusted by the system's store; the job names a bundle of its own (another
    authority), a directory of it, and a key log file that cannot be opened."""
    https = HttpsVendor(vast, tmp_path / "vendor")
    bogus, _ = localhost_cert(tmp_path / "jobs-own")  # an authority that vouches for nothing here
    try:
        ident, env = node_env(vast, tmp_path)
        env.update({name: proxy.url for name in PROXY_NAMES})
        env.update(
            FLEET_VAST_URL=https.url,
            SSL_CERT_FILE=str(bogus),
            SSL_CERT_DIR=str(bogus.parent),
            REQUESTS_CA_BUNDLE=str(bogus),
            CURL_CA_BUNDLE=str(bogus),
            SSLKEYLOGFILE="/nonexistent/keys.log",
        )
        given_back(vast, ident, run_failsafe(env, system_ca=https.cert))
    finally:
        https.close()
    assert proxy.taken == []


def test_an_authority_the_job_names_is_not_trusted(vast: FakeVastAI, tmp_path: Path) -> None:
    """A vendor whose certificate only the job's SSL_CERT_FILE vouches for: the failsafe refuses it (and
    asks again), since it trusts the system's store alone."""
    https = HttpsVendor(vast, tmp_path / "vendor")
    try:
        ident, env = node_env(vast, tmp_path)
        env.update(
            FLEET_VAST_URL=https.url, SSL_CERT_FILE=str(https.cert), SSL_CERT_DIR=str(https.cert.parent)
        )
        proc = run_failsafe(env)
        time.sleep(5)  # its deadline, a first refused call and the retry's wait
        still = alive(vast, ident)
        proc.kill()
        stderr = proc.communicate(timeout=10)[1]
    finally:
        https.close()
    assert still, stderr
    assert "did not take the node back" in stderr and "CERTIFICATE_VERIFY_FAILED" in stderr
    assert vast.state()["requests"].get("terminate", 0) == 0


def test_the_failsafe_reads_no_egress_setting_and_jobs_may_keep_theirs() -> None:
    """The job keeps its proxies and CA bundles (issue 39 decided so: its own downloads may need them), and
    the failsafe names none of them, nor urllib's or ssl's calls that would read them (`urlopen`'s default
    opener, `create_default_context`)."""
    assert all(envnames.job_may_set(name) for name in EGRESS_NAMES)
    tree = ast.parse(inspect.getsource(failsafe))
    strings = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert not strings & set(EGRESS_NAMES)
    assert not attributes & {
        "urlopen",
        "create_default_context",
        "load_default_certs",
        "set_default_verify_paths",
    }
