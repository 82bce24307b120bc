"""The node's failsafe, run as the start script ships it, against a real Ray head's dashboard log and the
fake vendors' APIs: it gives the node back when the fleet's heartbeat stops, at the node's deadline, and
never on requests that are not the fleet's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from pydantic import SecretStr

from jobs.sections import ProviderName
from providers.base import LaunchRequest, NodeEndpoint, ProviderContext
from providers.bootstrap import failsafe_argv
from providers.local.client import HeadMeta
from providers.node import NodeClient, jobs_api_answers, ping, user_agent
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes import FakeRunPod, FakeVastAI

pytestmark = pytest.mark.integration
KEY = "fleet-key-0123456789"
TIMEOUT_S = 6.0  # the heartbeat timeout of these nodes
SLACK_S = 5.0  # the failsafe polls every second; this machine is shared


@pytest.fixture
def vast(tmp_path: Path) -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=KEY, home=tmp_path / "fake", nodes="none") as fake:
        yield fake


class Failsafe:
    """The failsafe of one instance, as a process started the way the start script starts it."""

    def __init__(self, vendor: ProviderName, env: dict[str, str]) -> None:
        argv = failsafe_argv(vendor)
        argv[0] = sys.executable  # the node's python3
        base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "RAY_"))}
        self.proc = subprocess.Popen(argv, env={**base, **env}, stderr=subprocess.PIPE, text=True)
        self.started = time.monotonic()

    def stderr(self) -> str:
        """Its stderr, once it has ended (killed if it had not)."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.communicate(timeout=10)[1]


StartFailsafe = Callable[[ProviderName, dict[str, str]], Failsafe]


@pytest.fixture
def start_failsafe() -> Iterator[StartFailsafe]:
    """Starts failsafes; ends any still running after the test."""
    started: list[Failsafe] = []

    def start(vendor: ProviderName, env: dict[str, str]) -> Failsafe:
        started.append(Failsafe(vendor, env))
        return started[-1]

    yield start
    for failsafe in started:
        failsafe.stderr()


def vast_node(vast: FakeVastAI, tmp_path: Path, **failsafe_env: str) -> tuple[str, dict[str, str]]:
    """A launched vast.ai instance's id, and the failsafe's environment on it."""
    context = ProviderContext(
        home=tmp_path, credentials={"VAST_API_KEY": SecretStr(KEY)}, urls={"vastai": vast.url}
    )
    section = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, terminate_after=-1)
    inst = VastAIProvider(context).launch(LaunchRequest("tf-fs-1", "fs", section))
    row = vast.instances[inst.provider_id]
    env = {**row.env, **vast.container_env(inst.provider_id), **failsafe_env}
    return inst.provider_id, {k: v for k, v in env.items() if k != "FLEET_RAY_TOKEN"}


def alive(fake: FakeVastAI | FakeRunPod, ident: str) -> bool:
    return any(str(row["id"]) == ident for row in fake.state()["instances"])


def keep_calling(seconds: float, call: Callable[[], object], check: Callable[[], None]) -> float:
    """`call` about every second for `seconds`, `check`ing in between; when the last call ended."""
    end = time.monotonic() + seconds
    last = time.monotonic()
    while time.monotonic() < end:
        call()
        last = time.monotonic()
        check()
        time.sleep(1)
    return last


def wait_gone(fake: FakeVastAI | FakeRunPod, ident: str, within_s: float, failsafe: Failsafe) -> None:
    """Until the instance is gone; fails after `within_s`."""
    start = time.monotonic()
    while alive(fake, ident):
        assert time.monotonic() - start < within_s, f"the node was not given back: {failsafe.stderr()}"
        time.sleep(0.2)


def test_a_node_stays_while_the_fleet_calls_and_goes_when_it_stops(
    head: tuple[HeadMeta, NodeEndpoint],
    vast: FakeVastAI,
    tmp_path: Path,
    start_failsafe: StartFailsafe,
) -> None:
    meta, endpoint = head
    temp_dir = tmp_path / "ray"  # the head's temp dir shows up only after the failsafe started
    ident, env = vast_node(
        vast, tmp_path, FLEET_HEARTBEAT_TIMEOUT_S=f"{TIMEOUT_S:g}", FLEET_RAY_TEMP_DIR=str(temp_dir)
    )
    failsafe = start_failsafe(ProviderName("vastai"), env)
    time.sleep(2)
    temp_dir.symlink_to(meta.temp_dir)

    def up() -> None:
        assert alive(vast, ident), failsafe.stderr()

    keep_calling(TIMEOUT_S, lambda: ping(endpoint), up)  # the reaper's ping
    last = keep_calling(TIMEOUT_S, lambda: NodeClient(endpoint).info("no-such-job"), up)  # a stage's poll
    wait_gone(vast, ident, TIMEOUT_S + SLACK_S, failsafe)
    assert TIMEOUT_S - 0.5 <= time.monotonic() - last <= TIMEOUT_S + SLACK_S  # the failsafe read it after
    assert failsafe.proc.wait(timeout=10) == 0
    (line,) = failsafe.stderr().splitlines()
    assert (
        line == "trainfleet failsafe: no heartbeat from the fleet for 6 s: giving this vastai instance back"
    )
    assert vast.state()["requests"]["terminate"] == 1


def test_a_node_goes_at_its_deadline_even_while_the_fleet_calls(
    head: tuple[HeadMeta, NodeEndpoint],
    vast: FakeVastAI,
    tmp_path: Path,
    start_failsafe: StartFailsafe,
) -> None:
    meta, endpoint = head
    ident, env = vast_node(
        vast, tmp_path, FLEET_DEADLINE_S="4", FLEET_HEARTBEAT_TIMEOUT_S="60", FLEET_RAY_TEMP_DIR=meta.temp_dir
    )
    failsafe = start_failsafe(ProviderName("vastai"), env)
    while alive(vast, ident):
        assert time.monotonic() - failsafe.started < 4 + SLACK_S, (
            f"it outlived its deadline: {failsafe.stderr()}"
        )
        ping(endpoint)
        time.sleep(0.5)
    assert time.monotonic() - failsafe.started >= 4
    assert failsafe.proc.wait(timeout=10) == 0
    assert "the node's maximum lifetime of 4 s is over: giving this vastai instance back" in failsafe.stderr()


def test_calls_that_are_not_the_fleets_are_no_heartbeat_and_a_refused_destroy_is_retried(
    head: tuple[HeadMeta, NodeEndpoint],
    vast: FakeVastAI,
    tmp_path: Path,
    start_failsafe: StartFailsafe,
) -> None:
    meta, endpoint = head
    ident, env = vast_node(
        vast, tmp_path, FLEET_HEARTBEAT_TIMEOUT_S=f"{TIMEOUT_S:g}", FLEET_RAY_TEMP_DIR=meta.temp_dir
    )
    vast.add_faults([{"op": "terminate", "kind": "500"}])
    agent = {"User-Agent": user_agent()}
    token, wrong = endpoint.headers, {"Authorization": "Bearer not-the-token"}
    url = endpoint.jobs_url

    def not_the_fleets() -> None:
        jobs_api_answers(url, token)  # the right token, another agent (a person with the token)
        for path, headers in (
            ("/api/version", agent),  # the fleet's agent, no token
            ("/api/version", {**agent, **wrong}),  # ... a wrong one
            ("/api/jobs/x", agent),
            ("/api/healthz", agent),  # a public path
            ("/api/jobs/../healthz", agent),  # a public path in disguise
        ):
            with contextlib.suppress(urllib.error.HTTPError):  # urllib, which sends a path as it is
                urllib.request.urlopen(urllib.request.Request(url + path, headers=headers), timeout=5).close()
        forged = {**agent, "Referer": "x' 'GET /api/version HTTP/1.1' 200 "}  # fields faked after a request
        requests.get(f"{url}/api/healthz", headers=forged, timeout=5)

    failsafe = start_failsafe(ProviderName("vastai"), env)
    while alive(vast, ident):
        assert time.monotonic() - failsafe.started < TIMEOUT_S + SLACK_S, f"still up: {failsafe.stderr()}"
        not_the_fleets()
        time.sleep(0.5)
    assert time.monotonic() - failsafe.started >= TIMEOUT_S
    assert failsafe.proc.wait(timeout=10) == 0
    reason, refused = failsafe.stderr().splitlines()
    assert reason.endswith(
        "no heartbeat from the fleet for 6 s (the fleet never reached it): giving this vastai instance back"
    )
    assert "did not take the node back (HTTP Error 500" in refused
    assert vast.state()["requests"]["terminate"] == 2


def test_a_pod_terminates_itself_with_its_own_key(tmp_path: Path, start_failsafe: StartFailsafe) -> None:
    """RunPod: the pod-scoped key in the pod terminates that pod, and only that: the fleet's key never
    travels to it."""
    with FakeRunPod(api_key=KEY, home=tmp_path / "fake", nodes="none") as fake:
        context = ProviderContext(
            home=tmp_path,
            credentials={"RUNPOD_API_KEY": SecretStr(KEY)},
            urls={"runpod": fake.url},
            clouds={"runpod": RunPodSettings(**fake.proxy.values())},
        )
        provider = RunPodProvider(context)
        section = RunPodSection(gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5)
        pod = provider.launch(LaunchRequest("tf-fs-1", "fs", section, heartbeat_timeout_s=3))
        other = provider.launch(LaunchRequest("tf-fs-2", "fs", section))
        env = {**fake.instances[pod.provider_id].env, **fake.container_env(pod.provider_id)}
        assert KEY not in env.values() and env["FLEET_HEARTBEAT_TIMEOUT_S"] == "3"
        env["FLEET_RAY_TEMP_DIR"] = str(tmp_path / "no-head")  # a node the fleet never reaches
        failsafe = start_failsafe(ProviderName("runpod"), env)
        wait_gone(fake, pod.provider_id, 3 + SLACK_S, failsafe)
        assert time.monotonic() - failsafe.started >= 3
        assert failsafe.proc.wait(timeout=10) == 0
        assert "(the fleet never reached it): giving this runpod instance back" in failsafe.stderr()
        assert alive(fake, other.provider_id)
