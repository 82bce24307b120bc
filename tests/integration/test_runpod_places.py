"""Where a RunPod pod goes: `data_center` (any of the ids named) and `avoid` on the `runpod:` section, and a
`cloud:` section's `avoid` asking RunPod again, through the adapter against the fake RunPod API, which
knows RunPod's `dataCenters` and refuses a create where a data center has no machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.errors import NoCapacity, ProvisioningFailed
from jobs.sections import CloudSection, ProviderName
from providers.anycloud import rank
from providers.base import LaunchRequest
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from tests.fakes.runpod import FakeRunPod
from tests.integration.test_runpod_provider import KEY, provider_for

pytestmark = pytest.mark.integration
GPU = "NVIDIA RTX A5000"


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=KEY, home=tmp_path / "fake", nodes="none", ready_delay_s=0.1) as fake:
        yield fake


def places(provider: RunPodProvider, section: RunPodSection) -> set[str]:
    return {p.candidate.detail["data_center"] for p in provider.choose(section).fits}


def test_a_pod_goes_to_a_data_center_the_job_names_the_next_when_one_is_full(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    provider = provider_for(fake, tmp_path)
    section = RunPodSection(gpu=GPU, data_center=["EU-SE-1", "EU-RO-1"])
    assert places(provider, section) == {"EU-SE-1", "EU-RO-1"}
    assert fake.state()["requests"]["centers"] == 1
    fake.set_center_stock("EU-RO-1", GPU, 0)  # the first of them in the offers' order
    provider.launch(LaunchRequest("tf-r1-1", "r1", section))
    (row,) = fake.state()["instances"]
    assert fake.instances[str(row["id"])].extra["dataCenterId"] == "EU-SE-1"
    assert fake.state()["requests"]["create"] == 2  # EU-RO-1 refused it first

    fake.set_center_stock("EU-SE-1", GPU, 0)
    with pytest.raises(NoCapacity, match=r"no machine in any data center that fits: EU-RO-1: .*; EU-SE-1: "):
        provider.launch(LaunchRequest("tf-r2-1", "r2", section))
    assert len(fake.state()["instances"]) == 1


def test_a_pod_that_names_no_place_goes_where_runpod_puts_it(fake: FakeRunPod, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    provider.launch(LaunchRequest("tf-r1-1", "r1", RunPodSection(gpu=GPU)))
    (row,) = fake.state()["instances"]
    assert "dataCenterId" not in fake.instances[str(row["id"])].extra
    assert "centers" not in fake.state()["requests"]  # `dataCenters` is asked only when it matters


def test_avoid_keeps_pods_out_of_those_data_centers_and_says_so(fake: FakeRunPod, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    section = RunPodSection(gpu=GPU, avoid=["Europe", "CA"])
    assert places(provider, section) == {"US-GA-1", "US-TX-3"}
    why = {r.candidate.offer_id: r.reasons for r in provider.choose(section).rejected}
    assert why[f"{GPU}/SECURE/EU-RO-1"] == ("in EU-RO-1, Europe, which the job avoids (Europe)",)
    assert why[f"{GPU}/SECURE/CA-MTL-1"] == ("in CA-MTL-1, Canada, which the job avoids (CA)",)
    # A data center named and avoided is not rented in.
    named = RunPodSection(gpu=GPU, data_center=["EU-RO-1", "US-GA-1"], avoid=["RO"])
    assert places(provider, named) == {"US-GA-1"}


def test_a_data_center_runpod_does_not_have_is_refused_naming_those_it_has(
    fake: FakeRunPod, tmp_path: Path
) -> None:
    with pytest.raises(
        ProvisioningFailed, match=r"RunPod has no data center EU-XX-9 \(it has CA-MTL-1, EU-RO-1"
    ):
        provider_for(fake, tmp_path).choose(RunPodSection(gpu=GPU, data_center="EU-XX-9"))


def test_a_cloud_job_that_avoids_places_asks_runpod_per_data_center(fake: FakeRunPod, tmp_path: Path) -> None:
    provider = provider_for(fake, tmp_path)
    section = CloudSection(gpu=("RTX-A5000",), clouds=["runpod"], avoid=["United States", "Canada"])
    choice = rank(section, lambda cloud: provider)
    assert choice.unasked == ()
    assert {o.priced.candidate.detail["data_center"] for o in choice.fits} == {"EU-RO-1", "EU-SE-1"}
    assert all(o.priced.candidate.provider == ProviderName("runpod") for o in choice.fits)
