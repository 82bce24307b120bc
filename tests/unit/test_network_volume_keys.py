"""`network_volume:` in a `runpod:` section: what it must name, what it cannot sit beside, what the fleet
lets it cost (refused at submit, at its key), and RunPod's monthly rates for what `fleet volumes` shows."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from core.errors import ConfigError
from core.secrets import Secrets
from providers.registry import FleetSettings
from providers.runpod.section import RunPodSection
from providers.runpod.volumes import monthly_usd
from providers.world import World
from service.runs import check_submittable
from tests.unit.test_spec import HEAD, parse, problems_of

SECTION = "runpod:\n  gpu: NVIDIA RTX A5000\n"
SIZE, PLACE = "runpod.network_volume.size_in_gb", "runpod.network_volume.data_center"
VOLUME = "  network_volume:\n    size_in_gb: 100\n    data_center: EU-RO-1\n"


def test_a_volume_the_fleet_makes_is_named_sized_and_placed() -> None:
    section = parse(HEAD + SECTION + VOLUME).spec.section
    assert isinstance(section, RunPodSection) and section.asks_volume
    assert section.network_volume is not None and section.network_volume.volume_name == "tf-trainfleet"
    cluster = HEAD + "use_ray: true\n" + SECTION + "  num_nodes: 2\n" + VOLUME  # every pod mounts it
    assert parse(cluster).spec.section.num_nodes == 2
    assert not RunPodSection(gpu="x").asks_volume


@pytest.mark.parametrize(
    ("extra", "where", "said"),
    [
        (
            "  network_volume:\n    data_center: EU-RO-1\n",
            SIZE,
            "required key is missing",
        ),
        (
            "  network_volume:\n    size_in_gb: 5\n    data_center: EU-RO-1\n",
            SIZE,
            "10",
        ),
        ("  network_volume:\n    size_in_gb: 50\n", PLACE, "required key is missing"),
        (VOLUME.replace("EU-RO-1", "europe"), PLACE, "data center id"),
        (VOLUME + "    name: My Cache\n", "runpod.network_volume.name", "lower-case letters"),
        (VOLUME + "  network_volume_id: vol-1\n", "runpod.network_volume_id", "keep one of them"),
        (VOLUME + "  data_center: US-GA-1\n", "runpod.data_center", "a network volume's pods go where"),
    ],
)
def test_a_bad_network_volume_names_its_key_and_line(extra: str, where: str, said: str) -> None:
    found = problems_of(HEAD + SECTION + extra)
    assert any(p.path == where and said in p.message and p.line is not None for p in found), found


def test_the_fleet_caps_the_volume_a_job_may_make_at_submit(tmp_path: object) -> None:
    job = parse(HEAD + SECTION + VOLUME.replace("100", "800"))
    secrets = Secrets({"RUNPOD_API_KEY": SecretStr("k")}, tmp_path / "none.yml")  # type: ignore[operator]
    world = World.of(FleetSettings(home=tmp_path / "home"), secrets)  # type: ignore[operator]
    with pytest.raises(ConfigError) as caught:
        check_submittable(world, job)
    (problem,) = caught.value.problems
    assert problem.path == SIZE and problem.line is not None
    assert "800 GB ($56.00/month) is more than this fleet lets a job make (500 GB" in problem.message
    roomy = World.of(FleetSettings(home=tmp_path / "home", runpod_max_volume_gb=1000), secrets)  # type: ignore[call-arg, operator]
    check_submittable(roomy, job)


@pytest.mark.parametrize(("gb", "usd"), [(10, 0.7), (100, 7.0), (1000, 70.0), (1001, 70.05), (4000, 220.0)])
def test_a_volume_costs_runpods_rate_a_month(gb: int, usd: float) -> None:
    assert monthly_usd(gb) == usd
