"""The section's training switches (deepspeed, log_eval, prepare_ds_only, debug): refused at their key and
line when the job cannot honour them, and otherwise carried to the node (its TrainJob, its environment)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from core.errors import ConfigError, Problem
from jobs.sections import RemoteSection
from jobs.spec import JobSpec, LoadedJob, parse_job
from providers.registry import FleetSettings
from state.models import Run
from tests.factories import REPO_ROOT
from trainer import progress, verbosity
from trainer.config import ENV_PREFIX
from workers import context
from workers.node_job import node_env

TINY = (
    "base_model: trainfleet/tiny-llama\nadapter: lora\n"
    "datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n"
)
AXOLOTL = "trainer: axolotl\n" + TINY
ZERO2 = "trainer/assets/deepspeed_zero2.json"  # a DeepSpeed config of the job's own


def parse(text: str) -> LoadedJob:
    return parse_job(text.encode(), source="job.yml", base_dir=REPO_ROOT)


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return info.value.problems


@pytest.mark.parametrize(
    ("text", "path", "line", "message"),
    [
        (
            TINY + "use_ray: true\nrunpod:\n  gpu_count: 2\n  deepspeed: true\n",
            "runpod.deepspeed",
            9,
            "the builtin recipe does not train with DeepSpeed",
        ),
        (
            AXOLOTL + "runpod:\n  gpu_count: 1\n  deepspeed: true\n",
            "runpod.deepspeed",
            9,
            "DeepSpeed ZeRO shards the optimizer states and gradients across GPUs, and this job has 1",
        ),
        (
            AXOLOTL + f"deepspeed: {ZERO2}\nvastai:\n  gpu_count: 4\n  deepspeed: true\n",
            "vastai.deepspeed",
            10,
            "the training config names its own DeepSpeed config (deepspeed: ",
        ),
        (
            TINY + "local:\n  log_eval: true\n",
            "local.log_eval",
            7,
            "the eval samples table needs an eval set: set val_set_size",
        ),
        (
            TINY + "val_set_size: 0.1\neval_table_size: 0\nlocal:\n  log_eval: true\n",
            "local.log_eval",
            9,
            "asks for the eval samples table, and eval_table_size: 0 asks for none",
        ),
        (
            AXOLOTL + "runpod:\n  log_eval: true\n",
            "runpod.log_eval",
            8,
            "the eval samples table needs an eval set: set val_set_size (or test_datasets for axolotl)",
        ),
    ],
)
def test_a_switch_the_job_cannot_honour_is_refused_at_its_line(
    text: str, path: str, line: int, message: str
) -> None:
    (problem,) = problems_of(text)
    assert (problem.path, problem.line) == (path, line)
    assert problem.message.startswith(message)


@pytest.mark.parametrize(
    "text",
    [
        AXOLOTL + "runpod:\n  gpu_count: 2\n  deepspeed: true\n",
        AXOLOTL + "use_ray: true\nrunpod:\n  num_nodes: 2\n  network_volume_id: v1\n  deepspeed: true\n",
        AXOLOTL + "test_datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\nrunpod:\n  log_eval: true\n",
        TINY + "val_set_size: 0.1\nlocal:\n  log_eval: true\n  prepare_ds_only: true\n  debug: true\n",
    ],
)
def test_a_switch_the_job_can_honour_is_accepted(text: str) -> None:
    assert parse(text).spec


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[context.Context]:
    from broker.app import configure

    settings = FleetSettings(home=fleet_home)
    configure(settings, redis_url)
    yield context.init(settings, redis_url)


def sent(ctx: context.Context, text: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The TrainJob and the environment the run's Ray jobs get, for a local run of job file `text`."""
    spec: JobSpec = parse(text).spec
    run = Run(run_id="r1", provider="local", source="t", spec=spec, run_dir="/r", output_dir="/r/o")
    env = node_env(ctx, run)
    return json.loads(base64.b64decode(env[progress.ENV_VAR][len(ENV_PREFIX) :])), env


def test_the_switches_reach_the_node(ctx: context.Context) -> None:
    job, env = sent(
        ctx, TINY + "val_set_size: 0.1\nlocal:\n  log_eval: false\n  prepare_ds_only: true\n  debug: true\n"
    )
    assert (job["prepare_only"], job["log_eval"], job["debug"]) == (True, False, True)
    assert {k: env[k] for k in verbosity.DEBUG_ENV} == dict(verbosity.DEBUG_ENV)
    job, env = sent(ctx, TINY + "local: {}\n")
    assert (job["prepare_only"], job.get("log_eval"), job["debug"], job["deepspeed"]) == (
        False,
        None,
        False,
        False,
    )
    assert not set(verbosity.DEBUG_ENV) & set(env)


@pytest.mark.parametrize("key", ["wandb_watch: gradients", "wandb_log_model: end"])
def test_w_and_b_keys_the_builtin_recipe_does_not_read_choose_axolotl_or_are_refused(key: str) -> None:
    """The builtin recipe neither watches gradients nor logs the model to W&B (its result goes to the Hub):
    such a key picks axolotl, which reads it, or is refused for `trainer: builtin` at its line."""
    assert parse(TINY + key + "\nlocal: {}\n").choice.trainer == "axolotl"  # type: ignore[union-attr]
    (problem,) = problems_of("trainer: builtin\n" + TINY + key + "\nlocal: {}\n")
    assert (problem.path, problem.line) == (key.split(":")[0], 7)
    assert "the builtin recipe does not implement" in problem.message


def test_max_preemptions_is_for_spot_machines() -> None:
    (problem,) = problems_of(TINY + "runpod:\n  max_preemptions: 4\n")
    assert (problem.path, problem.line) == ("runpod.max_preemptions", 7)
    assert problem.message.startswith("an on-demand machine is not preempted")
    for pod_type in ("INTERRUPTABLE", "auto"):
        section = parse(TINY + f"runpod:\n  pod_type: {pod_type}\n  max_preemptions: 4\n").spec.section
        assert isinstance(section, RemoteSection) and section.max_preemptions == 4
    default = parse(TINY + "vastai: {}\n").spec.section
    assert isinstance(default, RemoteSection) and default.pod_type == "ON_DEMAND"
