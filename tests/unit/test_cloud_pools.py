"""A `cloud:` job that names pools of the operator's own machines (`clouds: [ssh:lab, vastai]`): the key
read strictly, the `ssh:` section written for a pool's machine, the keys that keep a pool out, a pool's
machines offered before every rental whatever they cost (never above the price cap), and what a submit
refuses. Who holds a machine needs the fleet's Redis: tests/integration/test_anycloud_pools.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from core.secrets import Secrets
from jobs.sections import CloudSection, ProviderName
from jobs.spec import load_job
from providers.anycloud import providers_of, rank
from providers.registry import FleetSettings
from providers.ssh.section import SshSection
from providers.world import World
from service.runs import check_submittable
from state.models import Placement, Run
from tests.factories import light_job_file
from tests.unit.test_anycloud import Catalogue, offer, parse

SSH, VAST = ProviderName("ssh"), ProviderName("vastai")
POOLS = (
    "pools:\n  lab:\n    user: me\n    key: /k\n    machines:\n"
    "      - {host: big, gpus: 4, gpu: RTX-A5000, hourly_usd: 0.5}\n"
    "      - {host: small, gpus: 1, gpu: RTX-A5000, hourly_usd: 0.4}\n"
    "      - {host: dear, gpus: 1, gpu: RTX-A5000, hourly_usd: 0.9}\n"
    "      - {host: other, gpus: 1, gpu: L40S}\n"
)


def world(tmp_path: Path, pools: str = POOLS, **settings: Any) -> World:
    (tmp_path / "pools.yml").write_text(pools)
    fleet = FleetSettings(home=tmp_path / "home", ssh_pools_file=tmp_path / "pools.yml", **settings)
    return World.of(fleet, Secrets({}, tmp_path / "none.yml"))


def test_clouds_may_name_pools_beside_the_rented_clouds() -> None:
    section = parse("cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab, vastai, ssh:lab]\n").spec.section
    assert isinstance(section, CloudSection)
    assert section.clouds == ("ssh:lab", "vastai")  # in the order written, each once
    assert (section.rented, section.pools) == ((VAST,), ((SSH, "lab"),))
    assert section.allows("ssh") and section.allows("vastai") and not section.allows("runpod")
    assert CloudSection.model_validate_json(section.model_dump_json()) == section  # as the ledger keeps it
    unset = parse("cloud:\n  gpu: rtx a5000\n").spec.section
    assert (
        isinstance(unset, CloudSection) and unset.pools == () and "ssh" not in unset.rented
    )  # never a default


@pytest.mark.parametrize(
    ("clouds", "said"),
    [
        ("[ssh]", "'ssh' names no pool: write ssh:POOL"),
        (
            "[runpod:lab]",
            "'runpod:lab' is not a cloud that rents GPUs, nor a pool; valid: runpod, vastai, ssh:POOL",
        ),
        ("['ssh:']", "'ssh:' is not a cloud that rents GPUs, nor a pool"),
    ],
)
def test_a_pool_is_written_as_its_provider_and_its_name(clouds: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(f"cloud:\n  gpu: rtx a5000\n  clouds: {clouds}\n")
    (problem,) = caught.value.problems
    assert (problem.path, problem.line) == ("cloud.clouds", 34) and said in problem.message, problem


def test_a_run_placed_on_a_pool_machine_runs_the_ssh_section_of_that_machine() -> None:
    spec = parse(
        "cloud:\n  gpu: [rtx a5000, l40s]\n  clouds: [ssh:lab, vastai]\n  terminate_after: 7200\n"
        "  stop_after: 60\n  one_shot: false\n  env: {A: b}\n"
    ).spec
    run = Run(
        run_id="r1", provider=ProviderName.CLOUD, source="job.yml", spec=spec, run_dir="/r", output_dir="/o"
    )
    placed = Placement(attempt=1, cloud=SSH, offer="lab/small", gpu="RTX-A5000", vendor_gpu="RTX-A5000",
                       secure=True, price_per_hour=0.4)  # fmt: skip
    run.progress.placements.append(placed)
    run.provider = SSH  # a provider of its clouds: its pool's
    node = Run.model_validate_json(run.model_dump_json()).node_section(0)
    assert isinstance(node, SshSection)
    assert (node.pool, node.gpu, node.gpu_count) == ("lab", ("RTX-A5000",), 1)  # the machine's type only
    assert (node.terminate_after, node.stop_after, node.one_shot, node.env) == (7200, 60, False, {"A": "b"})
    section = spec.section
    assert isinstance(section, CloudSection)
    whole = section.on_machines(SSH, "lab")  # the pool asked for any of the job's types
    assert isinstance(whole, SshSection) and whole.gpu == ("RTX-A5000", "L40S")


@pytest.mark.parametrize(
    ("keys", "key", "said"),
    [
        ("  min_vcpu_count: 16\n", "min_vcpu_count", "the pools file does not say a machine's vCPUs"),
        ("  image: me/trainer:1\n", "image", "a pool machine runs no container image"),
        ("  min_gpu_ram_in_gb: 40\n", "min_gpu_ram_in_gb", "none of RTX-A5000 has 40 GB per GPU"),
    ],
)
def test_a_key_no_pool_machine_can_honour_keeps_the_pools_out(keys: str, key: str, said: str) -> None:
    section = parse(f"cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab, vastai]\n{keys}").spec.section
    assert isinstance(section, CloudSection)
    refused = section.pool_refusal()
    assert refused is not None and refused[0] == key and said in refused[1], refused
    defaults = parse("cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab]\n  min_vcpu_count: 8\n").spec.section
    assert (
        isinstance(defaults, CloudSection) and defaults.pool_refusal() is None
    )  # a default asks nothing more
    kept = CloudSection.model_validate_json(
        defaults.model_dump_json()
    )  # as a worker reads it from the ledger
    assert kept.pool_refusal() is None


def test_a_pools_machines_come_before_every_rental_smallest_first_within_the_price_cap(
    tmp_path: Path,
) -> None:
    section = CloudSection.model_validate(
        {"gpu": "rtx a5000", "clouds": ["vastai", "ssh:lab"], "pod_type": "INTERRUPTABLE",
         "cloud_type": "ALL", "max_bid_per_gpu": 0.5}
    )  # fmt: skip
    vast = Catalogue(
        VAST, [offer(VAST, "1001", "RTX A5000", 0.09, detail={"gpu_memory_gb": "24", "location": "US"})]
    )
    ssh = providers_of(world(tmp_path).provider)
    choice = rank(section, lambda cloud: vast if cloud == VAST else ssh(cloud))  # type: ignore[arg-type,return-value]
    # The pool first though dearer than the rental; of its machines the smallest, then the cheapest
    assert [o.key for o in choice.fits] == ["ssh:lab/small", "ssh:lab/big", "vastai:1001"]
    assert [o.priced.price_per_hour for o in choice.fits] == [0.4, 0.5, 0.09]  # the whole machine, held whole
    assert choice.fits[0].gpu == choice.fits[0].vendor_gpu == "RTX-A5000" and choice.held == ()
    (dear,) = [r for r in choice.rejected if r.candidate.key == "ssh:lab/dear"]
    assert dear.reasons == ("$0.900/GPU/h (hourly_usd) is above max_bid_per_gpu $0.500",)
    assert "ssh:lab/other" not in {r.candidate.key for r in choice.rejected}  # another type: not this job's


def test_a_submit_refuses_a_pool_that_cannot_run_the_job_at_its_key_and_line(tmp_path: Path) -> None:
    def refused(section: str, fleet: World) -> tuple[str, int | None, str]:
        job = load_job(light_job_file(tmp_path / f"job{len(list(tmp_path.iterdir()))}", section))
        with pytest.raises(ConfigError) as caught:
            check_submittable(fleet, job)
        (problem,) = caught.value.problems
        assert problem.line == job.lines.get(problem.path), problem
        return problem.path, problem.line, problem.message

    fleet = world(tmp_path)
    path, _, said = refused("cloud:\n  gpu: rtx a5000\n  clouds: [ssh:gpus]\n", fleet)
    assert path == "cloud.clouds" and "ssh:gpus: the fleet has no pool 'gpus'" in said
    path, _, said = refused("cloud:\n  gpu: h100\n  clouds: [ssh:lab]\n", fleet)
    assert path == "cloud.clouds" and "ssh:lab: no machine of pool lab fits" in said
    path, line, said = refused(
        "cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab]\n  min_memory_in_gb: 64\n", fleet
    )
    assert path == "cloud.min_memory_in_gb" and line and "does not say a machine's memory" in said
    path, _, said = refused(
        "cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab, vastai]\n", world(tmp_path, providers="vastai")
    )
    assert path == "cloud.clouds" and "ssh:lab: this fleet does not run it (FLEET_PROVIDERS)" in said
    # A pool that can run it is enough: no cloud credential is needed
    check_submittable(
        fleet,
        load_job(light_job_file(tmp_path / "ok", "cloud:\n  gpu: rtx a5000\n  clouds: [ssh:lab, runpod]\n")),
    )
