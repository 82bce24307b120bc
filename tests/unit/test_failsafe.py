"""The node's failsafe without a node: which dashboard log lines are heartbeats, following a log that
appears, rotates and shrinks, how it refuses to run half-configured, and the start script that ships it."""

from __future__ import annotations

import ast
import base64
import json
import re
import shlex
import socket
import subprocess
import time
import zlib
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import load_settings
from jobs.sections import ProviderName
from providers.bootstrap import (
    JOIN_RETRY_S,
    container_command,
    failsafe_argv,
    node_setup_env,
    start_script,
)
from providers.onnode import failsafe
from providers.onnode.failsafe import LogTail, is_heartbeat

PREFIX = "2026-11-29 23:11:40,497\tINFO web_log.py:229 -- 127.0.0.1 [29/Nov/2026:23:11:40 +0000] "
FLEET = "'trainfleet/0.1.0 heartbeat'"


def access(request: str, status: int, agent: str = FLEET, referer: str = "'-'") -> str:
    """An access line as Ray 2.60's dashboard writes it (tests/integration/test_failsafe.py makes the same
    requests to a real head)."""
    return f"{PREFIX}'{request}' {status} 338 bytes 1414 us {referer} {agent}\n"


@pytest.mark.parametrize(
    ("line", "beat"),
    [
        (access("GET /api/version HTTP/1.1", 200), True),  # the reaper's ping
        (access("GET /api/jobs/nope HTTP/1.1", 404), True),  # a stage's poll (no such job)
        (access("POST /api/jobs/ HTTP/1.1", 200), True),
        (access("GET /api/version HTTP/1.1", 200, "'Python-urllib/3.11'"), False),  # not the fleet
        (access("GET /api/version HTTP/1.1", 401), False),  # no token
        (access("GET /api/version HTTP/1.1", 403), False),  # a wrong token
        (access("GET /api/healthz HTTP/1.1", 404), False),  # a public path
        (access("GET /api/jobs/../healthz HTTP/1.1", 404), False),  # one in disguise
        (access("GET /api/healthz HTTP/1.1", 404, referer="'x' 'GET /api/version HTTP/1.1' 200 '"), False),
        (access("GET /api/version?x'%20y HTTP/1.1", 403, agent=f"'evil' {FLEET}"), False),
        (access("GET /api/version HTTP/1.1", 200, agent=f"{FLEET} and more"), False),
    ],
)
def test_only_the_fleets_calls_that_the_token_let_through_are_heartbeats(line: str, beat: bool) -> None:
    assert is_heartbeat(line) is beat


def test_a_log_that_appears_later_rotates_and_shrinks_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "dashboard.log"
    tail = LogTail(str(path))
    assert tail.lines() == []  # not there yet (the head starts after the failsafe)
    path.parent.mkdir()
    path.write_text("one\ntw")
    assert tail.lines() == ["one"]  # a line still being written waits
    with path.open("a") as log:
        log.write("o\nthree\n")
    assert tail.lines() == ["two", "three"]
    with path.open("a") as log:
        log.write("four\n")
    path.rename(
        path.with_suffix(".log.1")
    )  # rotated: the old file is drained, the new one read from its start
    path.write_text("five\n")
    assert tail.lines() == ["four", "five"]
    path.write_text("six\n")  # truncated and written again, shorter than before
    assert tail.lines() == ["six"]
    path.unlink()
    assert tail.lines() == []
    path.write_text("seven\n")
    assert tail.lines() == ["seven"]


def test_what_the_log_holds_when_the_tail_starts_is_old(tmp_path: Path) -> None:
    path = tmp_path / "dashboard.log"
    path.write_text("old\n")
    tail = LogTail(str(path))
    with path.open("a") as log:
        log.write("new\n")
    assert tail.lines() == ["new"]


@pytest.mark.parametrize(
    ("argv", "env", "code", "message"),
    [
        (["vastai"], {}, 0, "off: neither FLEET_DEADLINE_S nor FLEET_HEARTBEAT_TIMEOUT_S is set"),
        (["gcp"], {"FLEET_DEADLINE_S": "60"}, 2, "off: unknown vendor 'gcp'; known: vastai, runpod"),
        (["vastai"], {"FLEET_HEARTBEAT_TIMEOUT_S": "60"}, 2, "off: FLEET_VAST_URL is not set"),
        (
            ["runpod"],
            {"FLEET_HEARTBEAT_TIMEOUT_S": "60", "FLEET_RUNPOD_URL": "u"},
            2,
            "off: RUNPOD_POD_ID is not set",
        ),
        (["vastai"], {"FLEET_DEADLINE_S": "soon"}, 2, "off: could not convert string to float: 'soon'"),
    ],
)
def test_a_failsafe_that_cannot_work_says_so_at_once(
    argv: list[str], env: dict[str, str], code: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert failsafe.main(argv, env) == code
    assert capsys.readouterr().err == f"trainfleet failsafe: {message}\n"


def test_the_start_script_starts_the_failsafe_first_and_inlines_no_value() -> None:
    script = start_script(ProviderName("vastai"))
    lines = script.splitlines()
    assert lines[0] == "set -eu"
    assert shlex.split(lines[1]) == [*failsafe_argv(ProviderName("vastai")), "&"]
    assert lines[-1] == (  # under a shell that traps SIGTERM (tests/unit/test_start_script_stop.py)
        "fleet_ray ray start --head --block --dashboard-host=0.0.0.0 --dashboard-port=8265"
        " --disable-usage-stats"
    )
    # Every value comes from the environment, by name (or is the script's own variable); the node's setup
    # program too (providers.onnode.nodesetup).
    own = {"RAY", "STOPPING", "S", "i", "rc"}
    assert [name for name in re.findall(r"\$\{?(\w+)", script) if name not in own] == [
        "FLEET_RAY_TOKEN", "FLEET_NODE_ROOT", "FLEET_NODE_ACCESS", "FLEET_NODE_ACCESS",
        "FLEET_STOP_NOTICE", "FLEET_STOP_NOTICE", "FLEET_STOP_NOTICE",
    ]  # fmt: skip
    assert 'os.environ["FLEET_NODE_SETUP"]' in script
    sh, dash_c, body = container_command(ProviderName("runpod"))
    assert (sh, dash_c) == ("sh", "-c") and shlex.split(body.splitlines()[1])[-2:] == ["runpod", "&"]
    assert "failsafe" not in start_script(None) and len(start_script(None)) < 900  # no vendor, no failsafe


def test_a_worker_nodes_script_joins_its_head_until_it_can_at_the_address_it_resolves(
    tmp_path: Path,
) -> None:
    """The script for real, under sh, with a `ray` that fails its first join and records its argv."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    fake_ray = bin_dir / "ray"
    fake_ray.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'[ "$(wc -l < {calls})" -ge 2 ] && kill "$PPID"\n'  # the second try: end the script there
        "exit 1\n"
    )
    fake_ray.chmod(0o755)
    script = start_script(None, worker=True, private_host="localhost")
    assert f"sleep {JOIN_RETRY_S}" in script
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FLEET_RAY_TOKEN": "t0k",
        "FLEET_NODE_ROOT": str(tmp_path / "root"),
        "FLEET_RAY_HEAD_ADDRESS": "abc123.runpod.internal:6379",
        **node_setup_env(),
        "FLEET_NODE_PINS": "",  # the node's software is all there: nothing to install
    }
    subprocess.run(["sh", "-c", script.replace(f"sleep {JOIN_RETRY_S}", "sleep 0")], env=env, timeout=30)
    tries = calls.read_text().splitlines()
    assert len(tries) == 2  # tried again after a failed join
    argv = shlex.split(tries[0])
    assert argv[:3] == ["start", "--block", "--disable-usage-stats"]
    assert "--address=abc123.runpod.internal:6379" in argv and "--head" not in argv
    (node_ip,) = [a for a in argv if a.startswith("--node-ip-address=")]
    assert node_ip.split("=", 1)[1] in ("127.0.0.1", "::1")  # what `localhost` resolves to
    setup = json.loads((tmp_path / "root" / "node-setup.json").read_text())  # the setup ran first
    assert setup["installed"] == [] and "error" not in setup


def test_a_worker_nodes_failsafe_lives_as_long_as_its_head_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failsafe, "POLL_S", 0.05)
    head = socket.socket()
    head.bind(("127.0.0.1", 0))
    head.listen()
    address = f"127.0.0.1:{head.getsockname()[1]}"
    assert failsafe.head_answers(address)
    answers = [True] * 10  # the head answers for a while, then goes (it gave itself back)

    def heard() -> bool:
        up = bool(answers) and answers.pop()
        if not up:
            head.close()
        return failsafe.head_answers(address) if up else False

    started = time.monotonic()
    why = failsafe.watch(heard, None, 0.3, f"no answer from the Ray head at {address}")
    assert why == f"no answer from the Ray head at {address} for 0.3 s"
    assert time.monotonic() - started >= 0.3 + 10 * 0.05 * 0.9  # not before the head was gone that long
    assert not failsafe.head_answers(address) and not failsafe.head_answers("nowhere")


def test_the_shipped_failsafe_is_the_module_without_its_docstrings() -> None:
    python3, dash_c, loader, vendor = failsafe_argv(ProviderName("vastai"))
    assert (python3, dash_c, vendor) == ("python3", "-c", "vastai")
    packed = re.fullmatch(
        r'import base64,zlib;exec\(zlib\.decompress\(base64\.b64decode\("(.+)"\)\)\)', loader
    )
    assert packed is not None
    source = zlib.decompress(base64.b64decode(packed.group(1))).decode()
    ast.parse(source, feature_version=(3, 9))  # a node's python3 may be older than ours (Ray 2.60: 3.9+)
    shipped: dict[str, object] = {"__name__": "shipped"}
    exec(compile(source, "failsafe", "exec"), shipped)
    assert shipped["HEARTBEAT"] == failsafe.HEARTBEAT and shipped["USER_AGENT"] == failsafe.USER_AGENT
    assert '"""' not in source and "# " not in source
    assert len(start_script(ProviderName("vastai"))) < 4500  # it travels in a field of a create call


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ({}, 1800),
        ({"FLEET_NODE_HEARTBEAT_TIMEOUT_S": "0"}, None),
        ({"FLEET_NODE_HEARTBEAT_TIMEOUT_S": "600"}, 600),
        ({"FLEET_REAP_INTERVAL_S": "60", "FLEET_NODE_HEARTBEAT_TIMEOUT_S": "180"}, 180),
    ],
)
def test_the_heartbeat_timeout_setting(tmp_path: Path, env: dict[str, str], value: float | None) -> None:
    settings = load_settings(env_file(tmp_path, env))
    assert settings.node_heartbeat_timeout_s == value


def env_file(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    (tmp_path / "empty.yml").write_text("")
    return {"FLEET_SETTINGS_FILE": str(tmp_path / "empty.yml"), **env}


@pytest.mark.parametrize(
    ("env", "floor"),
    [
        ({"FLEET_NODE_HEARTBEAT_TIMEOUT_S": "30"}, "90"),  # 3 reaper intervals of 30 s
        ({"FLEET_REAP_INTERVAL_S": "5", "FLEET_NODE_HEARTBEAT_TIMEOUT_S": "59"}, "60"),
        ({"FLEET_REAP_INTERVAL_S": "60", "FLEET_NODE_HEARTBEAT_TIMEOUT_S": "150"}, "180"),
    ],
)
def test_a_heartbeat_timeout_a_node_cannot_meet_is_refused(
    tmp_path: Path, env: dict[str, str], floor: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env_file(tmp_path, env))
    assert "node_heartbeat_timeout_s" in str(caught.value) and f"at least {floor} s" in str(caught.value)
