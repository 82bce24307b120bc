"""`fleet instances` and `fleet terminate` against a real Redis and real local Ray heads."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from fleet.cli import cli
from jobs.sections.local import LocalSection
from providers.base import LaunchRequest, NodeState, ProviderContext
from providers.local.provider import LocalProvider
from state.ledger import Ledger
from state.models import Instance, InstanceState, Run
from state.stages import RunState
from tests.factories import job_spec

pytestmark = pytest.mark.integration


@pytest.fixture
def env(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path) -> Iterator[dict[str, str]]:
    settings = fleet_home / "settings.yml"
    settings.write_text("{}\n")
    yield {"REDIS_URL": redis_url, "FLEET_HOME": str(fleet_home), "FLEET_SETTINGS_FILE": str(settings)}
    provider = LocalProvider(ProviderContext(home=fleet_home))
    for name in provider.heads.names():
        provider.terminate(name)


def start(home: Path, name: str) -> None:
    provider = LocalProvider(ProviderContext(home=home))
    provider.launch(LaunchRequest(name, name, LocalSection(num_cpus=1)))
    deadline = time.monotonic() + 60
    while (inst := provider.get(name)) is None or inst.state != NodeState.RUNNING:
        assert time.monotonic() < deadline, inst
        time.sleep(0.3)


def test_list_and_terminate(env: dict[str, str], redis_client: redis.Redis[str], fleet_home: Path) -> None:
    start(fleet_home, "tf-busy-1")
    start(fleet_home, "tf-stray-1")
    ledger = Ledger(redis_client)
    ledger.create_run(
        Run(
            run_id="busy",
            provider="local",
            source="t",
            spec=job_spec(),
            run_dir="/r",
            output_dir="/r/o",
            state=RunState.TRAINING,
        ),
        [],
    )
    ledger.put_instance(
        Instance(name="tf-busy-1", provider="local", run_id="busy", state=InstanceState.RUNNING)
    )

    listed = CliRunner().invoke(cli, ["instances", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert set(rows) == {"tf-busy-1", "tf-stray-1"}
    assert rows["tf-busy-1"]["run_id"] == "busy" and rows["tf-busy-1"]["run_state"] == "TRAINING"
    assert rows["tf-stray-1"]["run_id"] is None and rows["tf-stray-1"]["state"] == "RUNNING"

    shown = CliRunner().invoke(cli, ["node", "tf-stray-1", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    cluster = json.loads(shown.stdout)
    (head,) = cluster["nodes"]  # read from the head's own dashboard, as `ray status` would
    assert head["head"] and head["state"] == "ALIVE" and head["cpus"] == 1.0 and head["gpus"] == 0
    assert "Resources" in cluster["status"] or "Usage" in cluster["status"]

    refused = CliRunner().invoke(cli, ["terminate", "tf-busy-1"], env=env)
    assert refused.exit_code == 1 and "fleet cancel busy" in refused.output
    assert LocalProvider(ProviderContext(home=fleet_home)).get("tf-busy-1") is not None

    done = CliRunner().invoke(cli, ["terminate", "tf-stray-1"], env=env)
    assert done.exit_code == 0, done.output
    assert LocalProvider(ProviderContext(home=fleet_home)).get("tf-stray-1") is None

    forced = CliRunner().invoke(cli, ["terminate", "tf-busy-1", "--force"], env=env)
    assert forced.exit_code == 0, forced.output
    record = ledger.get_instance("tf-busy-1")
    assert record is not None and record.state == InstanceState.TERMINATED

    missing = CliRunner().invoke(cli, ["terminate", "tf-nope-1"], env=env)
    assert missing.exit_code == 1 and "no live instance" in missing.output
