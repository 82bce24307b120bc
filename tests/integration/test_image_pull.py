"""A machine whose image cannot be pulled fails the run, saying so, instead of renting the same failure
again and again or waiting node_ready_timeout_s in silence.

The fakes pull only the images they know (tests.fakes.node_images), each failing another as its cloud does:
RunPod stops the pod ("Exited by Runpod", no reason given), which looks like a spot pod outbid before it
came up; vast.ai leaves the instance `loading`, billing, with docker's error in its `status_msg`. Through
`fleet run` (its own worker and watcher) against in-process fakes; every machine rented is given back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeCloud, FakeRunPod, FakeVastAI
from tests.integration.clouds import API_KEY, VAST_KEY, failed_run

pytestmark = pytest.mark.integration

IMAGE = "me/no-such-trainer:v1"
FAST = {"FLEET_POLL_INTERVAL_S": "0.5", "FLEET_PREEMPT_BACKOFF_S": "0.5"}


def run_image(fake: FakeCloud, home: Path, tmp_path: Path, extra: str) -> tuple[dict[str, Any], list[Any]]:
    """`fleet run` of a light job on the fake's cloud with `image: IMAGE` and the section's `extra` keys:
    the run's status view and its events."""
    return failed_run(fake, home, tmp_path, f"  image: {IMAGE}\n{extra}", **FAST)


def rented(fake: FakeCloud) -> list[str]:
    """The state of every machine the fleet rented, terminated ones too (all must be)."""
    return [inst.state for inst in fake.instances.values()]


def preempted(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if e["type"] == "run.preempted"]


def test_an_on_demand_pod_runpod_stops_before_it_came_up_fails_the_run_at_once(
    home: Path, tmp_path: Path
) -> None:
    """An on-demand pod is never outbid: RunPod stopped it because it could not start it. No second pod."""
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="stub") as fake:
        view, evs = run_image(fake, home, tmp_path, "  pod_type: ON_DEMAND\n")
        assert rented(fake) == ["terminated"]
    assert view["state"] == "FAILED" and view["failure_reason"] == "PROVISIONING_FAILED", view
    message = view["failure_message"]
    assert "Exited by Runpod" in message and f"image {IMAGE}" in message, message
    assert "on-demand machine, never outbid" in message and "image exists and can be pulled" in message
    assert preempted(evs) == []


def test_a_spot_pod_stopped_before_it_came_up_is_replaced_once_then_the_run_fails(
    home: Path, tmp_path: Path
) -> None:
    """A spot pod stopped before it came up may have been outbid: one replacement; the second pod to stop
    so fails the run (before: up to max_preemptions pods rented, each failing alike)."""
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="stub") as fake:
        view, evs = run_image(fake, home, tmp_path, "  pod_type: INTERRUPTABLE\n")
        assert rented(fake) == ["terminated", "terminated"]
    assert view["state"] == "FAILED" and view["failure_reason"] == "PROVISIONING_FAILED", view
    message = view["failure_message"]
    assert "the second spot machine to stop before it came up" in message, message
    assert "max_bid_per_gpu" in message and f"image {IMAGE}" in message, message
    (replaced,) = preempted(evs)
    assert "before it came up" in replaced["data"]["why"], replaced


def test_a_vast_instance_whose_pull_failed_fails_the_run_with_dockers_words(
    home: Path, tmp_path: Path
) -> None:
    """vast.ai neither stops nor destroys an instance whose image cannot be pulled (it bills on): the fleet
    reads docker's error in its status_msg, fails the run with it, and destroys the instance."""
    with FakeVastAI(api_key=VAST_KEY, home=tmp_path / "fake", nodes="stub") as fake:
        view, evs = run_image(fake, home, tmp_path, "")
        assert rented(fake) == ["terminated"]
    assert view["state"] == "FAILED" and view["failure_reason"] == "PROVISIONING_FAILED", view
    message = view["failure_message"]
    assert "its image cannot be pulled: Error response from daemon: pull access denied" in message, message
    assert "me/no-such-trainer" in message and preempted(evs) == []
