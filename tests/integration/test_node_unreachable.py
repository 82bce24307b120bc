"""A node the fleet cannot reach says why, at once: a certificate the fleet's check refuses (RunPod's proxy
signed by an authority the fleet does not trust for it, or presenting a certificate for another name; a
vast.ai node's TLS front presenting another certificate than the one the fleet pinned) is a
`node.unreachable` event within one poll of the first failed handshake, and the run fails NODE_UNREACHABLE,
naming it, `node_tls_fail_after_s` later instead of NODE_TIMEOUT after node_ready_timeout_s (300 s here). A
node whose port refuses (the proxy's 502, the TLS front closing the connection while the node boots) is
said once, however many polls meet it, and waited out; the NODE_TIMEOUT that ends the wait names it.

Through `fleet run` (its own worker, watcher and all) against in-process fakes whose TLS servers count
their handshakes (tests.fakes.tls.Hellos): the first one is the first failure, as every handshake fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeCloud, FakeRunPod, FakeVastAI
from tests.fakes.tls import Fronted, Hellos, localhost_cert
from tests.integration.clouds import API_KEY, VAST_KEY, failed_run

pytestmark = pytest.mark.integration

POLL_S = 1.0  # FLEET_POLL_INTERVAL_S: the watcher's tick (the default)
BOUND_S = 3.0  # FLEET_NODE_TLS_FAIL_AFTER_S here (30 s by default)
READY_TIMEOUT_S = 10.0  # FLEET_NODE_READY_TIMEOUT_S for the nodes that never answer


def run_on(fake: FakeCloud, home: Path, tmp_path: Path, **settings: str) -> tuple[dict[str, Any], list[Any]]:
    """`fleet run` of a light job on the fake's cloud: the run's status view and its events."""
    return failed_run(fake, home, tmp_path, **{"FLEET_POLL_INTERVAL_S": f"{POLL_S:g}", **settings})


def fronts(fake: FakeCloud) -> Fronted:
    """The fake's node backend, whose nodes' TLS fronts a vast.ai instance publishes."""
    assert isinstance(fake.nodes, Fronted)
    return fake.nodes


def handshakes(fake: FakeCloud) -> Hellos:
    """The TLS handshakes the fleet's calls to nodes made: at RunPod's proxy, or at vast.ai nodes' fronts."""
    return fake.proxy.hellos if isinstance(fake, FakeRunPod) else fronts(fake).hellos


def said(evs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == kind]


def check_named_at_once(hellos: Hellos, evs: list[dict[str, Any]], cause: str, permanent: bool) -> float:
    """One node.unreachable event, of `cause`, within one poll of the first handshake, though many
    handshakes failed; returns the first handshake's time."""
    times = hellos.times
    assert len(times) >= 3, times  # the fleet looked again and again...
    (event,) = said(evs, "node.unreachable")  # ...and said it once
    first = times[0]
    data = event["data"]
    assert data["cause"] == cause and data["permanent"] is permanent, data
    assert data["endpoint"].startswith("https://127.0.0.1:") and "Bearer" not in json.dumps(data)
    assert event["time"] - first <= POLL_S, f"said {event['time'] - first:.2f} s after the first failure"
    return first


def wrong_authority(fake: FakeRunPod, tmp_path: Path) -> dict[str, str]:
    """The fleet trusts another authority for RunPod's proxy than the one that signed its certificate."""
    other, _key = localhost_cert(tmp_path / "other-ca")
    return {"FLEET_RUNPOD_PROXY_CA_FILE": str(other)}


def another_name(fake: FakeRunPod, tmp_path: Path) -> dict[str, str]:
    """The proxy presents a valid certificate (the fleet trusts it) for another name than it is called by."""
    return {"FLEET_RUNPOD_PROXY_CA_FILE": str(fake.proxy.present("proxy.elsewhere.test"))}


@pytest.mark.parametrize(
    ("misconfigure", "cause", "words"),
    [
        (wrong_authority, "certificate", "certificate verify failed: self-signed certificate"),
        (another_name, "hostname", "certificate is not valid for '127.0.0.1'"),
    ],
)
def test_a_proxy_certificate_the_fleet_refuses_fails_the_run_soon_naming_it(
    home: Path,
    tmp_path: Path,
    misconfigure: Callable[[FakeRunPod, Path], dict[str, str]],
    cause: str,
    words: str,
) -> None:
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="stub", ready_delay_s=0.2) as fake:
        settings = misconfigure(fake, tmp_path)
        view, evs = run_on(fake, home, tmp_path, FLEET_NODE_TLS_FAIL_AFTER_S=str(BOUND_S), **settings)
        first = check_named_at_once(fake.proxy.hellos, evs, cause, permanent=True)
        assert fake.state()["instances"] == []  # given back
    check_failed_soon(view, evs, first, cause, words)
    # ... and says which of RunPod's settings decides that check (the cloud's advice, from its package)
    setting = {"certificate": "(runpod_proxy_ca_file names", "hostname": "(runpod_proxy_url says"}[cause]
    assert setting in view["failure_message"], view["failure_message"]


def test_a_vast_node_presenting_another_certificate_than_the_pinned_one_fails_soon(
    home: Path, tmp_path: Path
) -> None:
    with FakeVastAI(api_key=VAST_KEY, home=tmp_path / "fake", nodes="stub", ready_delay_s=0.2) as fake:
        fronts(fake).impostor = True
        view, evs = run_on(fake, home, tmp_path, FLEET_NODE_TLS_FAIL_AFTER_S=str(BOUND_S))
        first = check_named_at_once(handshakes(fake), evs, "pin", permanent=True)
    check_failed_soon(view, evs, first, "pin", "not the certificate pinned for the node")


def check_failed_soon(
    view: dict[str, Any], evs: list[dict[str, Any]], first: float, cause: str, words: str
) -> None:
    """NODE_UNREACHABLE naming the cause, `BOUND_S` after it was first met (give or take a poll or two)."""
    assert view["state"] == "FAILED" and view["failure_reason"] == "NODE_UNREACHABLE", view
    message = view["failure_message"]
    assert "its Ray head at https://127.0.0.1:" in message and f": {cause}: " in message, message
    assert words in message, message
    (failed,) = said(evs, "run.failed")
    took = failed["time"] - first
    assert BOUND_S <= took <= BOUND_S + 3 * POLL_S, f"failed {took:.2f} s after the first failure"


@pytest.mark.parametrize("vendor", ["runpod", "vastai"])
def test_a_node_whose_port_refuses_is_said_once_and_named_when_the_wait_ends(
    home: Path, tmp_path: Path, vendor: str
) -> None:
    """No node behind the published port: RunPod's proxy answers 502, a vast.ai node's TLS front closes the
    connection (its node refuses it), as while a node boots; the run waits node_ready_timeout_s."""
    kind = FakeRunPod if vendor == "runpod" else FakeVastAI
    key = API_KEY if vendor == "runpod" else VAST_KEY
    with kind(api_key=key, home=tmp_path / "fake", nodes="none", ready_delay_s=0.2) as fake:
        view, evs = run_on(fake, home, tmp_path, FLEET_NODE_READY_TIMEOUT_S=str(READY_TIMEOUT_S))
        cause = "http" if vendor == "runpod" else "closed"
        check_named_at_once(handshakes(fake), evs, cause, permanent=False)
    assert view["state"] == "FAILED" and view["failure_reason"] == "NODE_TIMEOUT", view
    message = view["failure_message"]
    assert f"not ready after {READY_TIMEOUT_S:.0f} s; " in message, message
    assert f"Ray head does not answer: {cause} at https://127.0.0.1:" in message, message
    if vendor == "runpod":
        assert "HTTP 502" in message, message
