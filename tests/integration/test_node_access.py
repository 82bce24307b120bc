"""The ways into a rented node: with the fleet's `ssh_public_key`, the provision stage creates pods with SSH
(RunPod: `startSsh`, 22/tcp, PUBLIC_KEY; vast.ai: the ssh runtype and the key attached), and `fleet ssh RUN`
prints the command for the pod's published port 22, read back from the vendor's record through the real
clients and the fakes. `jupyter: true` gives the node JupyterLab with a token of its own, which `fleet
jupyter RUN` shows and which no event, ledger record or other Redis value ever holds."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from pydantic import SecretStr
from typer.testing import CliRunner

from fleet.cli import cli
from providers.base import LaunchRequest, Provider, ProviderContext, SshAccess
from providers.registry import FleetSettings
from providers.runpod.client import RunPodAPIError
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from providers.world import World
from service.nodeaccess import ssh_command
from service.runs import Fleet
from state.models import Instance, InstanceState
from state.stages import RunState, Stage
from tests.factories import ledger_run
from tests.fakes.base import Instance as FakeInstance
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI
from workers import context
from workers.runner import run_stage
from workers.stages import provision

pytestmark = pytest.mark.integration
RP_KEY, VAST_KEY = "rp-key", "vast-key"
BLOB = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(range(32))
PUBLIC_KEY = f"ssh-ed25519 {base64.b64encode(BLOB).decode()} me@laptop"
SECTION = RunPodSection(gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5, one_shot=False, jupyter=True)


@pytest.fixture
def fake(fleet_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=RP_KEY, home=fleet_home / "fake", nodes="none", ready_delay_s=0) as fake:
        monkeypatch.setenv("RUNPOD_API_KEY", RP_KEY)
        monkeypatch.setenv("FLEET_SECRETS_FILE", str(fleet_home / "no-secrets.yml"))
        yield fake


@pytest.fixture
def pub(tmp_path: Path) -> Path:
    """The fleet's key as a .pub file, with its private key beside it (what `ssh -i` names)."""
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "keys" / "id_ed25519.pub").write_text(PUBLIC_KEY + "\n")
    return tmp_path / "keys" / "id_ed25519.pub"


@pytest.fixture
def ctx(redis_client: redis.Redis[str], redis_url: str, fleet_home: Path, fake: FakeRunPod, pub: Path) -> Any:
    from broker.app import configure

    settings = FleetSettings.model_validate(
        {
            "home": fleet_home,
            "runpod_api_base_url": fake.url,
            **fake.proxy.values(),
            "redis_url": redis_url,
            "ssh_public_key": str(pub),
        }
    )
    configure(settings, redis_url)
    return context.init(settings, redis_url)


def provision_once(ctx: context.Context, run_id: str) -> None:
    """One provision task, as the worker runs it (it owns the run: the tick key holds its id)."""
    owner = ctx.dispatcher.owner(run_id) or "t1"
    run_stage(SimpleNamespace(request=SimpleNamespace(id=owner, retries=0), max_retries=12), run_id,
              Stage.PROVISION, provision.step)  # fmt: skip


def cli_env(ctx: context.Context, fake: FakeRunPod, pub: Path) -> dict[str, str]:
    (ctx.settings.home / "settings.yml").write_text("{}\n")
    return {
        "REDIS_URL": str(ctx.settings.redis_url),
        "FLEET_HOME": str(ctx.settings.home),
        "FLEET_SETTINGS_FILE": str(ctx.settings.home / "settings.yml"),
        "FLEET_SSH_PUBLIC_KEY": str(pub),
        "RUNPOD_API_BASE_URL": fake.url,
        "RUNPOD_API_KEY": RP_KEY,
    }


def running(provider: Provider, inst: FakeInstance) -> None:
    """Wait until the fake runs `inst` (a fake moves an instance on when it is listed)."""
    wait = time.monotonic() + 10
    while inst.state != "running":
        assert time.monotonic() < wait, f"{inst.name} never ran"
        provider.get(inst.name)
        time.sleep(0.05)


def values_holding(client: redis.Redis[str], secret: str) -> list[str]:
    """Every Redis key whose value (a string, a stream's entries, a list, a hash, a set) holds `secret`."""
    hits = []
    for key in client.scan_iter("*"):
        kind = client.type(key)  # type: ignore[no-untyped-call]
        if kind == "stream":
            values = [json.dumps(fields) for _sid, fields in client.xrange(key)]
        elif kind == "string":
            values = [client.get(key) or ""]
        elif kind == "list":
            values = client.lrange(key, 0, -1)
        elif kind == "hash":
            values = [json.dumps(client.hgetall(key))]
        else:
            values = [json.dumps(sorted(client.smembers(key)))] if kind == "set" else []
        hits += [key for value in values if secret in value]
    return hits


def test_a_pod_gets_ssh_and_jupyter_and_fleet_ssh_prints_its_address(
    ctx: context.Context, fake: FakeRunPod, pub: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx.ledger.create_run(ledger_run("r1", SECTION), [])
    ctx.dispatcher.claim("r1", "t1")
    provision_once(ctx, "r1")  # creates the pod; its Ray head never answers here, so provision polls on
    assert ctx.ledger.get_run("r1").state == RunState.PROVISIONING

    (pod,) = fake.instances.values()
    assert pod.extra["startSsh"] is True and pod.extra["ports"] == "8265/http,8888/http,22/tcp"
    assert pod.env["PUBLIC_KEY"] == PUBLIC_KEY  # RunPod's images put it in authorized_keys
    token = pod.env["FLEET_JUPYTER_TOKEN"]
    assert len(token) >= 40 and ctx.provider_context.ssh_public_key == PUBLIC_KEY

    running(ctx.provider("runpod"), pod)
    ssh_port = pod.extra["public_ports"][22]
    fleet = Fleet.connect(World.of(ctx.settings))
    command = ssh_command(fleet, "r1")
    assert command.access == SshAccess("127.0.0.1", ssh_port) and command.instance == "tf-r1-1"

    env = cli_env(ctx, fake, pub)
    shown = CliRunner().invoke(cli, ["ssh", "r1"], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.strip() == f"ssh -p {ssh_port} -i {pub.parent / 'id_ed25519'} root@127.0.0.1"
    as_json = CliRunner().invoke(cli, ["ssh", "r1", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    view = json.loads(as_json.stdout)
    assert (view["host"], view["port"], view["user"]) == ("127.0.0.1", ssh_port, "root")
    execs: list[tuple[str, list[str]]] = []
    monkeypatch.setattr("fleet.cli_nodes.os.execvp", lambda file, argv: execs.append((file, argv)))
    assert CliRunner().invoke(cli, ["ssh", "r1", "--exec"], env=env).exit_code == 0
    assert execs == [
        ("ssh", ["ssh", "-p", str(ssh_port), "-i", str(pub.parent / "id_ed25519"), "root@127.0.0.1"])
    ]

    lab = CliRunner().invoke(cli, ["jupyter", "r1"], env=env)
    assert lab.exit_code == 0, lab.output
    assert lab.stdout.strip() == f"https://{pod.id}-8888.proxy.runpod.net/lab?token={token}"
    # The token reached the pod and its owner, and nothing else: no event, ledger record or Redis value.
    events = ctx.redis.xrange("tf:events") + ctx.redis.xrange("tf:events:r1")
    assert events and values_holding(ctx.redis, token) == []

    # The node gone: a clear error, exit 1.
    ctx.provider("runpod").terminate("tf-r1-1")
    ctx.ledger.update_instance("tf-r1-1", state=InstanceState.TERMINATED)
    gone = CliRunner().invoke(cli, ["ssh", "r1"], env=env)
    assert gone.exit_code == 1 and "the node tf-r1-1 of run r1 is gone (TERMINATED)" in gone.output


def test_no_node_yet_and_a_node_without_ssh_say_what_to_do(
    ctx: context.Context, fake: FakeRunPod, pub: Path
) -> None:
    ctx.ledger.create_run(ledger_run("r2", SECTION), [])
    env = cli_env(ctx, fake, pub)
    never = CliRunner().invoke(cli, ["ssh", "r2"], env=env)
    assert never.exit_code == 1 and "run r2 has no node: it never got one (QUEUED)" in never.output

    # A pod created while the fleet had no key: no port 22, and the way to get one.
    plain = ProviderContext(
        home=ctx.settings.home,
        credentials={"RUNPOD_API_KEY": SecretStr(RP_KEY)},
        urls={"runpod": fake.url},
        clouds={"runpod": RunPodSettings(**fake.proxy.values())},
    )
    run = ledger_run("r3", RunPodSection(gpu="NVIDIA RTX A5000", max_bid_per_gpu=0.5))
    run.instance = run.instance_name
    ctx.ledger.create_run(run, [])
    RunPodProvider(plain).launch(LaunchRequest("tf-r3-1", "r3", run.spec.section))
    ctx.ledger.put_instance(
        Instance(name="tf-r3-1", provider="runpod", run_id="r3", state=InstanceState.RUNNING)
    )
    (pod,) = fake.instances.values()
    assert (
        pod.extra["startSsh"] is False and pod.extra["ports"] == "8265/http" and "PUBLIC_KEY" not in pod.env
    )
    running(ctx.provider("runpod"), pod)
    bare = CliRunner().invoke(cli, ["ssh", "r3"], env=env)
    assert (
        bare.exit_code == 1 and "instance tf-r3-1 has no SSH: set the fleet's ssh_public_key" in bare.output
    )
    lab = CliRunner().invoke(cli, ["jupyter", "r3"], env=env)
    assert lab.exit_code == 1 and "runs no JupyterLab: set `jupyter: true`" in lab.output

    # The fake reads `ports` as RunPod does: what it cannot read is refused, not ignored.
    spec = {"name": "tf-r4-1", "imageName": "img", "gpuTypeId": "NVIDIA RTX A5000", "bidPerGpu": 0.2}
    for ports in ("22/ssh", "8265/http,,22/tcp", "22/tcp,22/tcp"):
        with pytest.raises(RunPodAPIError, match="Invalid ports"):
            RunPodProvider(plain).client.rent_interruptable({**spec, "ports": ports})
    assert len(fake.instances) == 1


def test_a_vast_instance_gets_ssh_and_its_address_is_read_back(tmp_path: Path) -> None:
    with FakeVastAI(api_key=VAST_KEY, home=tmp_path / "fake", nodes="none", ready_delay_s=0) as fake:
        provider = VastAIProvider(
            ProviderContext(
                home=tmp_path,
                credentials={"VAST_API_KEY": SecretStr(VAST_KEY)},
                urls={"vastai": fake.url},
                ssh_public_key=PUBLIC_KEY,
            )
        )
        section = VastAISection(gpu="RTX_A5000", cloud_type="ALL", max_bid_per_gpu=0.5, jupyter=True)
        provider.launch(LaunchRequest("tf-v1-1", "v1", section))
        (inst,) = fake.instances.values()
        assert inst.extra["runtype"] == "ssh_direc ssh_proxy" and inst.extra["ssh_keys"] == [PUBLIC_KEY]
        assert inst.env["PUBLIC_KEY"] == PUBLIC_KEY and "8888:8888" in inst.extra["ports"]
        running(provider, inst)
        host_ports = inst.extra["host_ports"]
        assert provider.ssh_access("tf-v1-1") == SshAccess("127.0.0.1", host_ports[22])
        token = provider.tokens.jupyter("tf-v1-1")
        assert token == inst.env["FLEET_JUPYTER_TOKEN"]
        # Through the node's TLS front, with its pinned certificate (tests/security/test_jupyter_tls.py).
        assert provider.jupyter_url("tf-v1-1") == f"https://127.0.0.1:{host_ports[8888]}/lab?token={token}"
