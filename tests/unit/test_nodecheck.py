"""The readiness check's verdicts, in this process (the integration tests run it on fake nodes)."""

from __future__ import annotations

import importlib.metadata
import sys

from trainer.nodecheck import CPU_STANDIN_ENV, check

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"
RAY = importlib.metadata.version("ray")


def test_a_node_like_the_fleet_with_what_it_asks_for_passes() -> None:
    found = check(0, HERE, RAY, {})
    assert found["problems"] == [] and found["missing"] == {}
    assert found["executable"] == sys.executable and found["versions"]["peft"]


def test_gpus_that_cuda_does_not_see_fail_it_unless_the_node_is_a_cpu_standin() -> None:
    assert check(4, HERE, RAY, {})["problems"] == ["asked for 4 GPUs, CUDA sees 0"]
    assert check(1, None, None, {})["problems"] == ["asked for 1 GPU, CUDA sees 0"]
    standin = check(4, HERE, RAY, {CPU_STANDIN_ENV: "1"})
    assert standin["problems"] == [] and standin["cpu_standin"]
    assert check(4, HERE, RAY, {CPU_STANDIN_ENV: "yes"})["problems"]  # the marker is exactly "1"


def test_another_python_or_ray_than_the_fleets_fails_it() -> None:
    assert check(0, "3.10", "2.59.1", {})["problems"] == [
        f"Python {HERE} on the node, the fleet runs 3.10",
        f"Ray {RAY} on the node, the fleet runs 2.59.1",
    ]
