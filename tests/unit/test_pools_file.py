"""providers.ssh.pools: the operator's pools file, read strictly, each problem at its key path and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from providers.ssh.pools import read_pools

GOOD = """\
pools:
  lab:
    user: fleet
    key: ~/.ssh/fleet_lab
    hourly_usd: 1.2
    machines:
      - host: gpu1.lab.example
        gpus: 8
        gpu: a100 80gb
        labels: [nvlink]
      - {host: 10.0.0.7, port: 2222, gpus: 4, gpu: L40S, user: ops, hourly_usd: 0.5}
  cpu:
    machines:
      - {host: box, user: me, key: /keys/me, host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOk= me@box"}
"""


def _problems(tmp_path: Path, text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigError) as caught:
        read_pools(_write(tmp_path, text))
    return [(p.path, p.line, p.message) for p in caught.value.problems]


def test_a_pool_s_settings_are_its_machines_defaults(tmp_path: Path) -> None:
    pools = read_pools(_write(tmp_path, GOOD))
    one, two = pools.machines("lab")
    assert (one.name, one.address, one.user, one.key) == (
        "gpu1.lab.example", "gpu1.lab.example", "fleet", Path.home() / ".ssh/fleet_lab"
    )  # fmt: skip
    assert (one.gpus, one.gpu, one.labels, one.hourly_usd) == (8, "A100-80GB", ("nvlink",), 1.2)
    assert (two.name, two.address, two.user, two.hourly_usd) == (
        "10.0.0.7:2222",
        "[10.0.0.7]:2222",
        "ops",
        0.5,
    )
    (box,) = pools.machines("cpu")
    assert (box.gpus, box.gpu, box.hourly_usd, box.host_key) == (
        0, None, 0.0, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOk="
    )  # fmt: skip
    assert len(list(pools.every())) == 3


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pools.yml"
    path.write_text(text)
    return path


HEAD = "pools:\n  lab:\n    key: k\n    user: u\n    machines:\n"
"""A pool whose machines start at line 6."""


@pytest.mark.parametrize(
    ("text", "path", "line", "words"),
    [
        ("pool:\n  lab: {}\n", "pool", 1, "has `pools:` only"),
        ("pools:\n  Lab_1:\n    machines: [{host: a, user: u, key: k}]\n", "pools.Lab_1", 2, "lower-case"),
        ("pools:\n  lab:\n    machines: []\n", "pools.lab.machines", 3, "at least 1"),
        ("pools:\n  lab:\n    user: u\n    machines:\n      - {host: a, user: u}\n",
         "pools.lab.machines[0].key", 5, "no `key`"),
        (HEAD + "      - host: a\n        gpus: 2\n", "pools.lab.machines[0]", 6, "names their type"),
        (HEAD + "      - {host: a, gpus: 2, gpu: a100}\n", "pools.lab.machines[0].gpu", 6, "a group of GPU"),
        (HEAD + "      - {host: a, gpus: 2, gpu: a1000}\n", "pools.lab.machines[0].gpu", 6, "unknown GPU"),
        (HEAD + "      - {host: '-oProxyCommand=x'}\n", "pools.lab.machines[0].host", 6, "not a host name"),
        (HEAD + "      - {host: a, host_key: AAAA}\n", "pools.lab.machines[0].host_key", 6, "ssh-keyscan"),
        (HEAD + "      - {host: a, prot: 2}\n", "pools.lab.machines[0].prot", 6, "unknown key 'prot'"),
        (HEAD + "      - {host: a}\n      - {host: a, port: 22}\n", "pools.lab", 2, "listed twice: a:22"),
        ("pools:\n  lab:\n    key: k\n    user: root; rm\n    machines:\n      - {host: a}\n",
         "pools.lab.user", 4, "pattern"),
    ],
)  # fmt: skip
def test_each_problem_is_named_at_its_key_and_line(
    tmp_path: Path, text: str, path: str, line: int, words: str
) -> None:
    problems = _problems(tmp_path, text)
    assert any(p == path and n == line and words in m for p, n, m in problems), problems


def test_a_file_that_is_not_yaml_safe_is_refused(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "pools:\n  lab: &a {user: u}\n  two: *a\n")
    assert any("alias" in m for _, _, m in problems), problems
