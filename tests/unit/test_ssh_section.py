"""The `ssh:` section (providers.ssh.section) and which pool machines fit it (providers.ssh.fit): strict as
the clouds' sections, with key and line; a pool's machines are never a `cloud:` section's choice; what the
pools as declared can never give is refused before anything is claimed."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.secrets import Secrets
from jobs.clouds import provider_names, rented_clouds
from jobs.spec import LoadedJob, load_job, parse_job
from providers.registry import FleetSettings
from providers.ssh import fit
from providers.ssh.pools import Machine, Pools
from providers.ssh.section import SshSection
from providers.world import World
from service.pricecap import ceiling_per_hour
from service.runs import check_submittable
from tests.factories import light_job_file

HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n"


def parse(text: str) -> LoadedJob:
    return parse_job((HEAD + text).encode(), source="job.yml", base_dir=Path.cwd())


def problems(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigError) as info:
        parse(text)
    return [(p.path, p.line, p.message) for p in info.value.problems]


def test_an_ssh_job_names_a_pool_and_what_its_machines_must_have() -> None:
    job = parse("ssh:\n  pool: lab\n  gpu: [a100 80gb, H100]\n  gpu_count: 2\n  labels: [nvlink]\n")
    section = job.spec.section
    assert isinstance(section, SshSection) and job.spec.provider == "ssh"
    assert (section.pool, section.gpu_count, section.labels) == ("lab", 2, ("nvlink",))
    assert section.gpu is not None and section.gpu[:2] == ("A100-80GB", "H100-SXM")  # H100: each of its kinds
    assert job.spec.gpu_count == 2


@pytest.mark.parametrize(
    ("text", "path", "said"),
    [
        ("ssh: {pool: lab, image: my/image}\n", "ssh.image", "unknown key"),  # a rented cloud's key
        ("ssh: {pool: lab, pod_type: INTERRUPTABLE}\n", "ssh.pod_type", "unknown key"),
        ("ssh: {pool: Lab_1}\n", "ssh.pool", "must match the pattern"),
        ("ssh: {pool: lab, gpu: A9000}\n", "ssh.gpu", "unknown GPU type 'A9000'"),
        ("ssh: {pool: lab, gpu: L40S, gpu_count: 0}\n", "ssh.gpu", "gpu_count is 0"),
        ("ssh: {pool: lab, labels: [Not A Label]}\n", "ssh.labels[0]", "must match the pattern"),
    ],
)
def test_a_section_a_pool_cannot_honour_is_refused_at_its_key_and_line(
    text: str, path: str, said: str
) -> None:
    found = problems(text)
    assert [(p, line) for p, line, _ in found] == [(path, 4)], found
    assert said in found[0][2]


def test_the_pools_are_a_provider_of_their_own_and_never_a_rented_choice() -> None:
    assert "ssh" in provider_names() and "ssh" not in rented_clouds()
    assert problems("cloud: {gpu: L40S, clouds: [ssh]}\n")[0][0] == "cloud.clouds"


def machine(
    host: str, gpus: int = 0, gpu: str | None = None, labels: tuple[str, ...] = (), usd: float = 0
) -> Machine:
    return Machine(
        pool="lab", host=host, port=22, user="fleet", key=Path("/k"), gpus=gpus, gpu=gpu, labels=labels,
        hourly_usd=usd, host_key=None,
    )  # fmt: skip


BIG, SMALL, CHEAP = (
    machine("big", 8, "H100-SXM", ("nvlink",)),
    machine("small", 2, "L40S", usd=0.5),
    machine("cheap", 2, "L40S", usd=0.1),
)
POOLS = Pools(pools={"lab": (BIG, SMALL, CHEAP)}, source="pools.yml")


def test_the_smallest_fitting_machine_comes_first_then_the_cheapest() -> None:
    assert fit.fitting(POOLS.machines("lab"), SshSection(pool="lab", gpu_count=1)) == [CHEAP, SMALL, BIG]
    assert fit.fitting(POOLS.machines("lab"), SshSection(pool="lab", gpu_count=4)) == [BIG]
    assert fit.fitting(POOLS.machines("lab"), SshSection(pool="lab", labels=("nvlink",))) == [BIG]
    assert fit.fitting(POOLS.machines("lab"), SshSection.model_validate({"pool": "lab", "gpu": "H100"})) == [
        BIG
    ]


@pytest.mark.parametrize(
    ("section", "key", "said"),
    [
        ({"pool": "gpus"}, "pool", "the fleet has no pool 'gpus' (pools.yml); its pools: lab"),
        ({"pool": "lab", "gpu_count": 9}, "gpu_count", "big: 8 GPUs, fewer than gpu_count: 9"),
        ({"pool": "lab", "gpu": "A100-80GB"}, "gpu", "small: its GPUs are L40S, not A100-80GB"),
        ({"pool": "lab", "labels": ["ib"]}, "labels", "cheap: no label ib"),
        ({"pool": "lab", "gpu_count": 4, "num_nodes": 2}, "num_nodes", "1 machine(s) that fit (big), not 2"),
    ],
)
def test_what_the_pools_can_never_give_is_refused_naming_each_machine(
    section: dict[str, object], key: str, said: str
) -> None:
    refused = fit.refusal(POOLS, SshSection.model_validate(section))
    assert refused is not None and refused.key == key and said in refused.why, refused


def test_what_the_pools_can_give_is_not_refused_whoever_holds_the_machines() -> None:
    assert fit.refusal(POOLS, SshSection(pool="lab", gpu_count=2, num_nodes=3)) is None


def _world(tmp_path: Path, **settings: object) -> World:
    return World.of(FleetSettings(home=tmp_path / "home", **settings), Secrets({}, tmp_path / "none.yml"))


def test_a_fleet_without_pools_or_without_the_machines_refuses_the_job_at_submit_at_its_key(
    tmp_path: Path,
) -> None:
    loaded = load_job(light_job_file(tmp_path / "job", "ssh:\n  pool: lab\n  labels: [nvlink]\n"))
    with pytest.raises(ConfigError) as caught:
        check_submittable(_world(tmp_path), loaded)
    (problem,) = caught.value.problems
    assert problem.path == "ssh" and "the fleet has no pools: set ssh_pools_file" in problem.message
    pools = tmp_path / "pools.yml"
    pools.write_text(
        "pools:\n  lab:\n    machines:\n      - {host: box, user: me, key: /k, gpus: 1, gpu: L4}\n"
    )
    with pytest.raises(ConfigError) as caught:
        check_submittable(_world(tmp_path, ssh_pools_file=pools), loaded)
    (problem,) = caught.value.problems
    assert (problem.path, problem.line) == ("ssh.labels", loaded.lines["ssh.labels"])
    assert "no machine of pool lab fits (box: no label nvlink)" in problem.message
    pools.write_text(pools.read_text().replace("gpu: L4", "gpu: L4, labels: [nvlink]"))
    check_submittable(_world(tmp_path, ssh_pools_file=pools), loaded)  # it fits: nothing said


def test_a_pool_job_s_hourly_bound_is_its_dearest_machines_that_fit_held_or_not(tmp_path: Path) -> None:
    pools = tmp_path / "pools.yml"
    pools.write_text(
        "pools:\n  lab:\n    user: me\n    key: /k\n    machines:\n"
        "      - {host: a, gpus: 1, gpu: L40S, hourly_usd: 0.5}\n"
        "      - {host: b, gpus: 1, gpu: L40S, hourly_usd: 1.2}\n"
        "      - {host: c, gpus: 2, gpu: L40S, hourly_usd: 2.0}\n"
        "      - {host: d, gpus: 1, gpu: H100-SXM, hourly_usd: 9.0}\n"  # another type: never this job's
    )
    fleet = _world(tmp_path, ssh_pools_file=pools)
    pair = parse("use_ray: true\nssh:\n  pool: lab\n  gpu: L40S\n  num_nodes: 2\n").spec
    assert ceiling_per_hour(fleet, pair) == 3.2  # c and b: no two machines it may claim cost more
    assert ceiling_per_hour(fleet, parse("ssh:\n  pool: lab\n  gpu_count: 2\n").spec) == 2.0
    assert ceiling_per_hour(fleet, parse("local:\n  one_shot: true\n").spec) is None
