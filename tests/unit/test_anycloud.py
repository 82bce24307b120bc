"""A `cloud:` job: GPU names in the fleet's normal form (jobs.gpus), the section's checks
(jobs.sections.cloud), the vendor sections it writes, and the offers of every cloud ranked together
(providers.anycloud), with the clouds' own choosers standing in as fixed catalogues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from core.errors import ConfigError, CredentialsMissing, ProviderUnavailable
from jobs import clouds as cloud_facts
from jobs.clouds import avoided
from jobs.gpus import GPU_TYPES, resolve
from jobs.sections import CloudSection, ProviderName
from jobs.spec import parse_job
from providers.anycloud import rank, summary
from providers.offers import Candidate, Choice, choose
from providers.runpod.section import RunPodSection
from providers.vastai.section import VastAISection
from state.models import Placement, Run
from tests.factories import EXAMPLE_YAML

HEAD = EXAMPLE_YAML.read_text().split("local:")[0].replace("ray_num_workers: 2\n", "")


def parse(section: str) -> Any:
    return parse_job(HEAD.encode() + section.encode(), source="job.yml", base_dir=EXAMPLE_YAML.parent)


@pytest.mark.parametrize(
    ("said", "meant"),
    [
        ("A100-80GB", ("A100-80GB",)),
        ("a100 80gb", ("A100-80GB",)),
        ("A100 80G", ("A100-80GB",)),
        ("NVIDIA A100 80GB PCIe", ("A100-80GB",)),  # RunPod's id
        ("NVIDIA GeForce RTX 4090", ("RTX-4090",)),
        ("RTX_4090", ("RTX-4090",)),  # vast.ai's query spelling
        ("4090", ("RTX-4090",)),
        ("rtx a6000", ("RTX-A6000",)),
        ("H100", ("H100-SXM", "H100-PCIE")),
        ("A100 PCIE", ("A100-80GB", "A100-40GB")),  # vast.ai's name is both sizes
        ("l40s", ("L40S",)),
    ],
)
def test_a_gpu_is_read_loosely_into_the_fleets_names(said: str, meant: tuple[str, ...]) -> None:
    assert resolve(said) == meant


def test_an_unknown_gpu_names_the_nearest_and_every_known_one() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU type 'A1000' \(did you mean A100\?\); known: B200"):
        resolve("A1000")


def test_every_gpu_type_is_rented_somewhere_and_each_runpod_id_means_one_type() -> None:
    seen: dict[str, str] = {}
    for t in GPU_TYPES.values():
        assert any(t.vendor_names(cloud) for cloud in cloud_facts.declared()), t.name
        for said in t.vendor_names("runpod"):
            assert seen.setdefault(said, t.name) == t.name
            assert resolve(said) == (t.name,)
    for cloud, facts in cloud_facts.declared().items():  # a cloud names only types the fleet knows
        assert set(facts.gpu_names) <= set(GPU_TYPES), cloud


def test_a_name_a_cloud_gives_two_types_stands_for_both_and_the_offer_s_memory_tells_them_apart() -> None:
    a100 = GPU_TYPES["A100-80GB"]
    assert resolve("A100 PCIE") == ("A100-80GB", "A100-40GB")  # vast.ai's name for either size
    assert a100.sharing_names("vastai") == [GPU_TYPES["A100-40GB"]]
    assert a100.sharing_names("runpod") == []  # RunPod's name says the size


def test_a_cloud_section_in_a_job_file() -> None:
    job = parse("cloud:\n  gpu: [h100, A100 80GB]\n  clouds: [vastai]\n  max_bid_per_gpu: 1.2\n")
    section = job.spec.section
    assert job.spec.provider == ProviderName.CLOUD and isinstance(section, CloudSection)
    assert section.gpu == ("H100-SXM", "H100-PCIE", "A100-80GB")
    assert section.clouds == (ProviderName("vastai"),) and section.max_attempts == 3
    assert CloudSection.model_validate_json(section.model_dump_json()) == section  # as the ledger keeps it


@pytest.mark.parametrize(
    ("text", "where", "said"),
    [
        ("cloud:\n  gpu: A1000\n", "cloud.gpu", "did you mean A100?"),
        ("cloud:\n  gpu: []\n", "cloud.gpu", "non-empty list"),
        ("cloud:\n  clouds: [aws]\n", "cloud.clouds", "'aws' is not a cloud that rents GPUs"),
        ("cloud:\n  clouds: [local]\n", "cloud.clouds", "'local' is not a cloud that rents GPUs"),
        (
            "cloud:\n  template_id: abc\n",
            "cloud.template_id",
            "it belongs in a runpod section, not cloud",
        ),  # a vendor's own key
        ("cloud:\n  num_nodes: 2\n", "cloud.num_nodes", "a cloud that joins its machines into one"),
        ("cloud:\n  max_attempts: 0\n", "cloud.max_attempts", "must be between 1 and 10 (got 0)"),
    ],
)
def test_a_bad_cloud_section_names_its_key_and_line(text: str, where: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)
    (problem,) = [p for p in caught.value.problems if p.path == where]
    assert said in problem.message and problem.line is not None


def test_the_vendor_sections_it_writes_keep_the_shared_keys() -> None:
    section = CloudSection(
        pod_type="INTERRUPTABLE",
        gpu=("A100-80GB",),
        max_bid_per_gpu=1.5,
        min_vcpu_count=16,
        min_gpu_ram_in_gb=70,
    )
    runpod = section.on(ProviderName("runpod"), "NVIDIA A100 80GB PCIe", secure=False)
    assert isinstance(runpod, RunPodSection)
    assert (runpod.gpu, runpod.cloud_type, runpod.volume_in_gb) == ("NVIDIA A100 80GB PCIe", "COMMUNITY", 0)
    assert (runpod.max_bid_per_gpu, runpod.min_vcpu_count, runpod.stop_after) == (1.5, 16, 900)
    vast = section.on(ProviderName("vastai"), "A100 PCIE")
    assert isinstance(vast, VastAISection)
    assert (vast.gpu, vast.min_gpu_ram_in_gb, vast.cloud_type) == ("A100 PCIE", 70, "SECURE")


def test_a_run_of_a_cloud_job_is_on_the_cloud_its_offer_chose_and_rents_that_offers_section() -> None:
    spec = parse("cloud:\n  gpu: RTX-A5000\n  cloud_type: ALL\n").spec
    run = Run(
        run_id="r1", provider=ProviderName.CLOUD, source="job.yml", spec=spec, run_dir="/r", output_dir="/o"
    )
    with pytest.raises(ValueError, match="no offer chosen for attempt 1 yet"):
        run.node_section(0)
    placed = Placement(attempt=1, cloud=ProviderName("vastai"), offer="1001", gpu="RTX-A5000",
                       vendor_gpu="RTX A5000", secure=False, price_per_hour=0.09)  # fmt: skip
    run.progress.placements.append(placed)
    run.provider = ProviderName("vastai")
    moved = Run.model_validate_json(run.model_dump_json())
    assert moved.placement == placed and moved.node_section(0) == spec.section.on(  # type: ignore[union-attr]
        ProviderName("vastai"), "RTX A5000", secure=False
    )
    with pytest.raises(ValueError, match="provider runpod is not the job's"):  # not one of its clouds
        Run(
            **{
                **run.model_dump(),
                "provider": ProviderName("runpod"),
                "spec": parse("cloud:\n  clouds: [vastai]\n").spec,
            }
        )
    run.attempt = 2
    assert run.placement is None  # the next attempt has no offer until provision chooses one


class Catalogue:
    """A cloud's chooser over a fixed list of offers (what RemoteProvider.choose does after its API call)."""

    def __init__(
        self, name: ProviderName, offers: Sequence[Candidate], fail: Exception | None = None
    ) -> None:
        self.name, self.offers, self.fail = name, offers, fail
        self.asked: list[str] = []

    def refusal(self, section: object) -> None:
        return None  # (a private image's login: tests/integration/test_private_images.py)

    def choose(self, section: RunPodSection | VastAISection) -> Choice:
        if self.fail is not None:
            raise self.fail
        self.asked.append(section.gpu)
        return choose(section, section.gpu, self.offers)


def offer(cloud: ProviderName, offer_id: str, gpu: str, bid: float, **kw: Any) -> Candidate:
    values: dict[str, Any] = dict(provider=cloud, offer_id=offer_id, gpu=gpu, gpu_count=1, vcpus=16,
                                  on_demand_per_hour=None, min_bid_per_gpu=bid, memory_gb=64,
                                  secure=True)  # fmt: skip
    return Candidate(**(values | kw))


A100 = {"gpu_memory_gb": "80"}
RUNPOD = [
    offer(ProviderName("runpod"), "NVIDIA A100 80GB PCIe/SECURE", "NVIDIA A100 80GB PCIe", 0.82, detail=A100),
    offer(
        ProviderName("runpod"),
        "NVIDIA A100 80GB PCIe/COMMUNITY",
        "NVIDIA A100 80GB PCIe",
        0.60,
        secure=False,
        detail=A100,
    ),
    offer(
        ProviderName("runpod"),
        "NVIDIA RTX A5000/SECURE",
        "NVIDIA RTX A5000",
        0.13,
        detail={"gpu_memory_gb": "24"},
    ),
]
VAST = [
    offer(ProviderName("vastai"), "11", "A100 PCIE", 0.55, detail={"gpu_memory_gb": "80", "location": "US"}),
    offer(ProviderName("vastai"), "12", "A100 PCIE", 0.30, detail={"gpu_memory_gb": "40", "location": "US"}),
    offer(ProviderName("vastai"), "13", "A100 SXM4", 0.70, detail={"gpu_memory_gb": "80", "location": "CN"}),
    offer(ProviderName("vastai"), "14", "A100 PCIE", 1.90, detail={"gpu_memory_gb": "80", "location": "DE"}),
]


def clouds(**fail: Exception) -> dict[ProviderName, Catalogue]:
    return {
        ProviderName("runpod"): Catalogue(ProviderName("runpod"), RUNPOD, fail.get("runpod")),
        ProviderName("vastai"): Catalogue(ProviderName("vastai"), VAST, fail.get("vastai")),
    }


def test_every_clouds_offers_are_ranked_together_cheapest_first() -> None:
    section = CloudSection(
        pod_type="INTERRUPTABLE", gpu=("A100-80GB",), cloud_type="ALL", max_bid_per_gpu=1.0
    )
    made = clouds()
    choice = rank(section, made.__getitem__)  # type: ignore[arg-type]
    keys = [o.key for o in choice.fits]
    assert keys == [
        "vastai:11",
        "runpod:NVIDIA A100 80GB PCIe/COMMUNITY",
        "vastai:13",
        "runpod:NVIDIA A100 80GB PCIe/SECURE",
    ]
    assert {o.gpu for o in choice.fits} == {"A100-80GB"}
    assert made[ProviderName("vastai")].asked == ["A100 PCIE", "A100 SXM4"]  # each of vast.ai's names for it
    why = {r.candidate.offer_id: r.reasons for r in choice.rejected}
    assert why["12"] == ("40 GB per GPU: not a A100-80GB",)  # vast.ai calls both sizes A100 PCIE
    assert "above max_bid_per_gpu" in why["14"][0]
    assert "NVIDIA RTX A5000/SECURE" not in why  # another type's offers are not this job's
    assert choice.best(["vastai:11"]) is not None and choice.best(["vastai:11"]).key == keys[1]  # type: ignore[union-attr]


def test_avoid_leaves_out_offers_there_and_those_that_do_not_say_where() -> None:
    section = CloudSection(
        pod_type="INTERRUPTABLE", gpu=("A100",), cloud_type="ALL", max_bid_per_gpu=1.0, avoid=("CN",)
    )
    choice = rank(section, clouds().__getitem__)  # type: ignore[arg-type]
    assert [o.key for o in choice.fits] == ["vastai:12", "vastai:11"]  # A100 is either size
    why = {r.candidate.offer_id: r.reasons for r in choice.rejected}
    assert why["13"] == ("in CN, which the job avoids (CN)",)
    # These RunPod offers name no data center (the real provider's do, asked to avoid: test_runpod_places)
    assert why["NVIDIA A100 80GB PCIe/SECURE"] == (
        "it does not say where it is, and the job avoids places (avoid)",
    )
    assert choice.unasked == ()


@pytest.mark.parametrize(
    ("where", "avoid", "hit"),
    [
        ("China, CN", ("CN",), "CN"),
        ("EU-RO-1, Europe", ("ro",), "ro"),  # a country code in a data center's id
        ("EU-RO-1, Europe", ("EU-RO-1",), "EU-RO-1"),
        ("EU-RO-1, Europe", ("Europe",), "Europe"),
        ("EU-SE-1, Europe", ("RO",), None),  # not inside "Europe": whole names only
        ("Sweden, SE", ("den", "Swe"), None),
        ("United States", ("united states",), "united states"),
    ],
)
def test_avoid_matches_whole_names(where: str, avoid: tuple[str, ...], hit: str | None) -> None:
    assert avoided(where, avoid) == hit


def test_gpu_memory_holds_on_every_cloud() -> None:
    section = CloudSection(
        pod_type="INTERRUPTABLE",
        gpu=("RTX-A5000", "A100-80GB"),
        cloud_type="ALL",
        max_bid_per_gpu=1.0,
        min_gpu_ram_in_gb=40,
    )
    choice = rank(section, clouds().__getitem__)  # type: ignore[arg-type]
    assert "runpod:NVIDIA RTX A5000/SECURE" not in [o.key for o in choice.fits] and choice.fits
    why = {r.candidate.offer_id: r.reasons for r in choice.rejected}
    assert why["NVIDIA RTX A5000/SECURE"] == ("GPU memory 24 GB < 40 GB",)


def test_a_cloud_that_cannot_be_asked_says_why_and_the_others_still_are() -> None:
    section = CloudSection(
        pod_type="INTERRUPTABLE", gpu=("A100-80GB",), cloud_type="ALL", max_bid_per_gpu=1.0
    )
    down = ProviderUnavailable("vast.ai API 503: down")
    made = clouds(
        runpod=CredentialsMissing("RUNPOD_API_KEY is not set: put it in the environment"), vastai=down
    )
    choice = rank(section, made.__getitem__)  # type: ignore[arg-type]
    assert choice.fits == () and choice.errors[1] is down
    assert [c for c, _ in choice.unasked] == [ProviderName("runpod"), ProviderName("vastai")]
    assert "RUNPOD_API_KEY is not set" in summary(choice)
    only = rank(section, clouds().__getitem__, fleet_runs=("vastai",))  # type: ignore[arg-type]
    assert {o.cloud for o in only.fits} == {ProviderName("vastai")}
    assert only.unasked == ((ProviderName("runpod"), "this fleet does not run it (FLEET_PROVIDERS)"),)
