"""Network volumes the fleet makes (`network_volume:`): found again by name in their data center, made
within the fleet's cap, one at a time under the fleet's lock, listed with their monthly cost and deleted by
`fleet volumes`, through the adapter and the provision stage's step against the fake RunPod's REST API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from core.errors import NodeError, ProvisioningFailed
from providers.base import LaunchRequest, ProviderContext
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from state.events import read_run
from state.ledger import Ledger
from state.payloads import VolumeReady
from tests.factories import ledger_run
from tests.fakes.runpod import FakeRunPod
from tests.integration.clouds import API_KEY, job_for
from tests.integration.fleetproc import events_of, fleet, fleet_env
from tests.integration.test_runpod_provider import KEY
from workers import storage

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A5000"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY, home=tmp_path / "fake", nodes="none", ready_delay_s=0.1) as fake:
        yield fake


def provider_for(fake: FakeRunPod, tmp_path: Path, max_gb: int = 500) -> RunPodProvider:
    own = RunPodSettings(**fake.proxy.values(), runpod_rest_url=fake.rest_url, runpod_max_volume_gb=max_gb)
    credentials = {"RUNPOD_API_KEY": SecretStr(KEY)}
    context = ProviderContext(
        home=tmp_path, credentials=credentials, urls={"runpod": fake.url}, clouds={"runpod": own}
    )
    return RunPodProvider(context)


def asking(name: str = "cache", size: int = 50, where: str = "EU-RO-1") -> RunPodSection:
    ask = {"name": name, "size_in_gb": size, "data_center": where}
    return RunPodSection.model_validate({"gpu": GPU, "network_volume": ask})


def test_a_volume_is_made_once_then_found_again_by_name_and_data_center(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    made = provider.volume(asking())
    assert made is not None and made[1] is True
    volume = made[0]
    assert (volume.name, volume.where, volume.size_gb) == ("tf-cache", "EU-RO-1", 50)
    assert volume.monthly_usd == 3.5
    again = provider.volume(asking(size=80))  # its size counts when it is made, not after
    assert again is not None and again == (volume, False)
    elsewhere = provider.volume(asking(where="US-GA-1"))
    assert elsewhere is not None and elsewhere[1] and elsewhere[0].volume_id != volume.volume_id
    assert fake.network_volumes.made == 2
    # The pod mounts it, and keeps its runs on it.
    provider.launch(LaunchRequest("tf-v1-1", "v1", asking(), volume=volume.volume_id))
    (pod,) = fake.instances.values()
    assert pod.extra["networkVolumeId"] == volume.volume_id
    assert pod.env["FLEET_NODE_ROOT"] == "/content/trainfleet"
    with pytest.raises(ProvisioningFailed, match="no volume was found or made"):
        provider.launch(LaunchRequest("tf-v2-1", "v2", asking()))


def test_the_fleet_lists_and_deletes_only_its_own_volumes_and_not_while_mounted(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    fake.add_network_volume("by-hand", "EU-RO-1")  # someone's own volume: never the fleet's to delete
    provider = provider_for(fake, tmp_path, max_gb=2000)
    made = provider.volume(asking(size=1500))
    assert made is not None
    volume = made[0]
    # 1000 GB at $0.07 a month and 500 at $0.05
    assert [(v.name, v.monthly_usd) for v in provider.volumes()] == [("tf-cache", 95.0)]
    with pytest.raises(NodeError, match="by-hand is not one of the fleet's network volumes"):
        provider.delete_volume("by-hand")
    provider.launch(LaunchRequest("tf-v1-1", "v1", asking(), volume=volume.volume_id))
    with pytest.raises(NodeError, match="is in use by a pod"):
        provider.delete_volume(volume.volume_id)
    provider.terminate("tf-v1-1")
    provider.delete_volume(volume.volume_id)
    assert provider.volumes() == [] and "by-hand" in fake.network_volumes


def test_a_volume_over_the_fleets_cap_is_refused_and_never_made(fake: FakeRunPod, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path, max_gb=100)
    refusal = provider.refusal(asking(size=200))
    assert refusal is not None and refusal.key == "network_volume.size_in_gb"
    assert "200 GB ($14.00/month) is more than this fleet lets a job make (100 GB" in refusal.why
    with pytest.raises(ProvisioningFailed, match="runpod_max_volume_gb"):
        provider.volume(asking(size=200))
    assert fake.network_volumes.made == 0 and provider.refusal(asking(size=100)) is None


class _Ctx:
    """What storage.volume_for uses of a worker's context: the fleet's Redis and the ledger."""

    def __init__(self, client: redis.Redis[str]) -> None:
        self.redis, self.ledger = client, Ledger(client)


def test_two_runs_of_one_name_at_once_make_one_volume_and_each_says_so(
    fake: FakeRunPod, tmp_path: Path, redis_client: redis.Redis[str]
) -> None:
    ctx = _Ctx(redis_client)
    section = asking()
    runs = [ledger_run(f"r{k}", section) for k in range(4)]
    for run in runs:
        ctx.ledger.create_run(run, [])
    providers = [provider_for(fake, tmp_path) for _ in runs]  # each worker process has its own
    got: dict[str, str | None] = {}

    def provision(k: int) -> None:
        volume = storage.volume_for(ctx, runs[k], providers[k], section, f"tf-r{k}-1")  # type: ignore[arg-type]
        got[runs[k].run_id] = volume

    threads = [threading.Thread(target=provision, args=(k,)) for k in range(len(runs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert fake.network_volumes.made == 1 and len(set(got.values())) == 1
    said = [e.data for r in runs for _sid, e in read_run(redis_client, r.run_id)]
    ready = [d for d in said if isinstance(d, VolumeReady)]
    assert sorted(d.made for d in ready) == [False, False, False, True]
    assert {d.volume_id for d in ready} == set(got.values()) and {d.instance for d in ready} == {
        f"tf-r{k}-1" for k in range(len(runs))
    }
    plain = RunPodSection(gpu=GPU)  # asks for none: no lock, no event
    assert storage.volume_for(ctx, runs[0], providers[0], plain, "tf-r0-2") is None  # type: ignore[arg-type]


VOLUME_SECTION = (
    "runpod:\n  gpu: NVIDIA RTX A5000\n  max_bid_per_gpu: 0.5\n  one_shot: true\n"
    "  network_volume:\n    name: cache\n    size_in_gb: 50\n    data_center: EU-RO-1\n"
)


@pytest.mark.timeout(240)
def test_a_run_gets_its_volume_and_fleet_volumes_shows_what_it_costs_and_deletes_it(
    home: Path, tmp_path: Path
) -> None:
    """`fleet run` on a replay pod (every stage, no Ray): the provision stage makes the volume the job asks
    for, the pod mounts it, and `fleet volumes` lists it with its monthly cost until deleted."""
    with FakeRunPod(api_key=API_KEY, home=tmp_path / "fake", nodes="replay") as fake:
        fake.nodes.replayer.train_s = 1.0  # type: ignore[attr-defined]
        env = fleet_env(
            home, RUNPOD_API_BASE_URL=fake.url, RUNPOD_API_KEY=API_KEY, FLEET_RUNPOD_REST_URL=fake.rest_url
        )
        done = fleet(env, "run", str(job_for(tmp_path, VOLUME_SECTION)), "--json", timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        view = json.loads(done.stdout)
        (ready,) = [e["data"] for e in events_of(home, view["run_id"]) if e["type"] == "volume.ready"]
        assert (ready["name"], ready["where"], ready["size_gb"], ready["made"]) == (
            "tf-cache",
            "EU-RO-1",
            50,
            True,
        )
        (pod,) = fake.instances.values()
        assert pod.extra["networkVolumeId"] == ready["volume_id"] and pod.state == "terminated"

        listed = fleet(env, "volumes", "--json")
        assert listed.returncode == 0, listed.stderr[-2000:]
        (row,) = json.loads(listed.stdout)
        assert (row["volume_id"], row["monthly_usd"], row["provider"]) == (ready["volume_id"], 3.5, "runpod")
        table = fleet(env, "volumes")
        assert "tf-cache" in table.stdout and "1 volume(s), $3.50 a month" in table.stdout, table.stdout
        gone = fleet(env, "volumes", "--delete", ready["volume_id"], "--yes")
        assert gone.returncode == 0 and f"deleted tf-cache ({ready['volume_id']}, runpod)" in gone.stdout
        assert json.loads(fleet(env, "volumes", "--json").stdout) == [] and not list(fake.network_volumes)
