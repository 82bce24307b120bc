"""The RunPod fake, driven by the real runpod-python SDK (and raw GraphQL where the SDK has no call)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import runpod
import runpod.api.graphql
import runpod.error
from pydantic import SecretStr
from runpod.api.mutations.pods import generate_pod_deployment_mutation

from providers.local.client import LocalHeads
from providers.runpod.client import RunPodAPIError, RunPodClient
from providers.runpod.models import PodsData, PodSpec
from tests.fakes import FakeRunPod
from tests.fakes.nodes import NoNodes, RayNodes
from tests.fakes.tls import Fronted
from trainer.progress import NODE_ROOT_ENV

pytestmark = pytest.mark.integration

KEY = "rp-test-key"
GPU = "NVIDIA RTX A6000"
POD_SPEC: PodSpec = {"name": "tf-1", "imageName": "img", "gpuTypeId": GPU, "gpuCount": 1, "cloudType": "ALL"}
SPOT = """
mutation Rent($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id desiredStatus costPerHr env name }
}
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRunPod]:
    # A pod's node is ready 1 s after its create, so a test can read it as not yet running right after
    # the create on a loaded machine too (at 0.1 s that is a race).
    with FakeRunPod(api_key=KEY, home=tmp_path, nodes="none", ready_delay_s=1.0) as server:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
        monkeypatch.setattr(runpod, "api_key", KEY)
        yield server


def gql(fake: FakeRunPod, query: str, variables: dict[str, Any] | None = None, key: str = KEY) -> Any:
    response = requests.post(
        f"{fake.url}/graphql",
        json={"query": query, "variables": variables or {}},
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )
    return response


def wait_running(pod_id: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = runpod.get_pod(pod_id)
        if pod and pod["runtime"]:
            return dict(pod)
        time.sleep(0.05)
    raise AssertionError(f"pod {pod_id} never got a runtime")


def test_sdk_lifecycle(fake: FakeRunPod) -> None:
    created = runpod.create_pod("tf-run-1", "img:1", GPU, env={"FLEET_RAY_TOKEN": "s3cret"})
    pod = runpod.get_pod(created["id"])
    assert pod["name"] == "tf-run-1"
    assert pod["desiredStatus"] == "RUNNING"
    assert pod["runtime"] is None
    assert pod["costPerHr"] == pytest.approx(0.33)

    pod = wait_running(created["id"])
    (port,) = pod["runtime"]["ports"]
    assert (port["ip"], port["privatePort"], port["type"]) == ("127.0.0.1", 8265, "http")
    assert isinstance(port["publicPort"], int)
    assert [p["id"] for p in runpod.get_pods()] == [created["id"]]

    state = fake.state()
    (row,) = state["instances"]
    assert row["env_keys"] == ["FLEET_RAY_TOKEN"]
    assert "s3cret" not in str(state)
    assert row["bid"] is None and row["gpu"] == GPU and row["gpu_count"] == 1

    assert runpod.stop_pod(created["id"]) == {"id": created["id"], "desiredStatus": "EXITED"}
    assert runpod.get_pod(created["id"])["runtime"] is None
    assert runpod.terminate_pod(created["id"]) is None
    assert runpod.get_pod(created["id"]) is None
    assert runpod.get_pods() == []
    assert fake.state()["requests"]["search"] == 1  # create_pod's get_gpu check


def test_spot_with_variables_round_trips_quotes(fake: FakeRunPod) -> None:
    value = 'has "quote" and \\ backslash'
    spec = {
        "name": "tf-spot",
        "gpuTypeId": GPU,
        "gpuCount": 2,
        "bidPerGpu": 0.3,
        "cloudType": "SECURE",
        "imageName": "img",
        "env": [{"key": "NOTE", "value": value}],
    }
    body = gql(fake, SPOT, {"input": spec}).json()
    pod = body["data"]["podRentInterruptable"]
    assert set(pod) == {"id", "desiredStatus", "costPerHr", "env", "name"}
    assert pod["env"] == [f"NOTE={value}"]
    assert pod["costPerHr"] == pytest.approx(0.6)
    (row,) = fake.state()["instances"]
    assert (row["bid"], row["gpu_count"], row["name"]) == (0.3, 2, "tf-spot")

    low = gql(fake, SPOT, {"input": {**spec, "bidPerGpu": 0.01}}).json()
    assert "minimum bid" in low["errors"][0]["message"]


def test_inline_literal_escapes_and_sdk_quote_bug(fake: FakeRunPod) -> None:
    literal = 'mutation { podFindAndDeployOnDemand(input: {name: "a\\"b\\u00e9", gpuTypeId: "'
    literal += (
        GPU + '", env: [{key: "K", value: "v"}], gpuCount: 1, cloudType: ALL, startSsh: true}) { id name } }'
    )
    assert gql(fake, literal).json()["data"]["podFindAndDeployOnDemand"]["name"] == 'a"b\u00e9'
    with pytest.raises(runpod.error.QueryError, match="Syntax Error"):
        runpod.create_pod("q", "img", GPU, env={"A": 'has "quote"'})  # the SDK does not escape


def test_wrong_key_is_401(fake: FakeRunPod, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runpod, "api_key", "wrong")
    with pytest.raises(runpod.error.AuthenticationError):
        runpod.get_pods()
    assert gql(fake, "{ myself { pods { id } } }", key="").status_code == 401


def test_a_pod_key_terminates_its_own_pod_and_does_nothing_else(fake: FakeRunPod) -> None:
    """RUNPOD_API_KEY inside a pod (what its failsafe uses) is good for that pod's terminate only."""
    one, two = (runpod.create_pod(name, "img", GPU)["id"] for name in ("tf-a-1", "tf-b-1"))
    own = fake.container_env(one)
    assert own["RUNPOD_POD_ID"] == one and own["RUNPOD_API_KEY"] not in (
        KEY,
        fake.container_env(two)["RUNPOD_API_KEY"],
    )
    terminate = "mutation T($input: PodTerminateInput!) { podTerminate(input: $input) }"
    key = own["RUNPOD_API_KEY"]
    assert gql(fake, terminate, {"input": {"podId": two}}, key=key).status_code == 401
    assert gql(fake, "query { myself { pods { id } } }", key=key).status_code == 401
    both = 'mutation { a: podTerminate(input: {podId: "%s"}) b: podTerminate(input: {podId: "%s"}) }'
    assert gql(fake, both % (one, two), key=key).status_code == 401
    assert gql(fake, terminate, {"input": {"podId": one}}, key=key).json() == {"data": {"podTerminate": None}}
    assert [p["id"] for p in runpod.get_pods()] == [two]


def test_no_capacity_and_unknown_field(fake: FakeRunPod) -> None:
    fake.set_stock(GPU, 0)
    with pytest.raises(runpod.error.QueryError, match="no longer any instances available"):
        runpod.create_pod("x", "img", GPU)
    runpod.create_pod("y", "img", "NVIDIA RTX A5000")
    errors = gql(fake, "{ myself { pods { id bogus } } }").json()["errors"]
    assert 'Cannot query field "bogus"' in errors[0]["message"]


def test_500_and_error_after_create(fake: FakeRunPod) -> None:
    fake.add_faults([{"op": "list", "kind": "500"}])
    response = gql(fake, "{ myself { pods { id } } }")
    assert response.status_code == 500 and response.json()["errors"]
    assert runpod.get_pods() == []  # consumed

    fake.add_faults([{"op": "create", "kind": "error_after_create"}])
    with pytest.raises(runpod.error.QueryError):
        runpod.create_pod("tf-half", "img", GPU)
    (row,) = requests.get(f"{fake.url}/_fake/state", timeout=5).json()["instances"]
    assert row["name"] == "tf-half"


def test_429_timeout_not_found_and_ghost_listing(fake: FakeRunPod) -> None:
    requests.post(
        f"{fake.url}/_fake/faults",
        json=[{"op": "*", "kind": "429", "retry_after": 7}, {"op": "get", "kind": "timeout", "delay": 1.0}],
        timeout=5,
    ).raise_for_status()
    limited = gql(fake, "{ myself { pods { id } } }")
    assert (limited.status_code, limited.headers["Retry-After"]) == (429, "7")
    query = '{ pod(input: {podId: "nope"}) { id } }'
    with pytest.raises(requests.exceptions.ReadTimeout):
        headers = {"Authorization": f"Bearer {KEY}"}
        requests.post(f"{fake.url}/graphql", json={"query": query}, headers=headers, timeout=0.3)

    pod_id = runpod.create_pod("tf-ghost", "img", GPU)["id"]
    fake.add_faults([{"op": "terminate", "kind": "not_found"}])
    with pytest.raises(runpod.error.QueryError, match="pod not found to terminate"):
        runpod.terminate_pod(pod_id)
    fake.add_faults([{"op": "terminate", "kind": "terminate_ok_but_listed", "times": 2}])
    runpod.terminate_pod(pod_id)
    assert runpod.get_pod(pod_id)["desiredStatus"] == "RUNNING"
    assert [p["desiredStatus"] for p in runpod.get_pods()] == ["RUNNING"]
    assert runpod.get_pods() == []
    assert fake.state()["instances"] == []


def test_preempt_spot(fake: FakeRunPod) -> None:
    body = gql(fake, SPOT, {"input": {"name": "s", "gpuTypeId": GPU, "bidPerGpu": 0.5, "imageName": "i"}})
    pod_id = body.json()["data"]["podRentInterruptable"]["id"]
    wait_running(pod_id)
    assert requests.post(f"{fake.url}/_fake/preempt/{pod_id}", timeout=5).json() == {"preempted": True}
    pod = runpod.get_pod(pod_id)
    assert (pod["desiredStatus"], pod["runtime"]) == ("EXITED", None)


def test_ray_node_behind_published_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "fake-ray-token-0123456789"
    with FakeRunPod(api_key=KEY, home=tmp_path, nodes="ray") as server:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
        monkeypatch.setattr(runpod, "api_key", KEY)
        pod_id = runpod.create_pod("tf-ray", "img", GPU, env={"FLEET_RAY_TOKEN": token})["id"]
        pod = wait_running(pod_id, timeout=120)
        port = pod["runtime"]["ports"][0]["publicPort"]
        url = f"http://127.0.0.1:{port}/api/version"
        assert requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
        assert requests.get(url, timeout=5).status_code in (401, 403)
        heads = LocalHeads(tmp_path / "nodes")
        meta = heads.read(f"runpod-{pod_id}")
        assert meta is not None and heads.processes(meta)
        runpod.terminate_pod(pod_id)
        assert not heads.processes(meta)


def test_command_line_serve(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes", "serve", "runpod", "--port", "0", "--nodes", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "FAKE_API_KEY": KEY},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        state = requests.get(f"{url}/_fake/state", timeout=5).json()
        assert state == {
            "instances": [],
            "requests": {},
            "listed_at": [],
            "most_live": {},
            "faults_served": {},
        }
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


PODS = "query Pods { myself { pods { id name } } }"
DEPLOY = """
mutation Deploy($input: PodFindAndDeployOnDemandInput!) { podFindAndDeployOnDemand(input: $input) { id } }
"""


def deploy(fake: FakeRunPod, name: str, timeout: float = 10) -> requests.Response:
    spec = {"name": name, "imageName": "x", "gpuTypeId": GPU, "gpuCount": 1, "cloudType": "SECURE"}
    return requests.post(
        f"{fake.url}/graphql",
        json={"query": DEPLOY, "variables": {"input": spec}},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=timeout,
    )


def test_the_fault_suites_witnesses_every_nth_fault_and_a_hang(fake: FakeRunPod) -> None:
    """What tests/faults relies on: `every`, "hang", and the fake's record of served faults and of the
    most instances of one name ever live at once."""
    fake.add_faults([{"op": "list", "kind": "500", "times": 2, "every": 3}])
    statuses = [gql(fake, PODS).status_code for _ in range(7)]
    assert statuses == [200, 200, 500, 200, 200, 500, 200]

    fake.add_faults([{"op": "create", "kind": "hang", "delay": 1.0}])
    with pytest.raises(requests.Timeout):
        deploy(fake, "tf-twice-1", timeout=0.3)  # carried out, the answer withheld past the timeout
    first = fake.state()["instances"]
    assert [row["name"] for row in first] == ["tf-twice-1"]
    second = deploy(fake, "tf-twice-1").json()["data"]["podFindAndDeployOnDemand"]["id"]
    runpod.terminate_pod(second)
    state = fake.state()
    assert [row["id"] for row in state["instances"]] == [first[0]["id"]]
    assert state["most_live"] == {"tf-twice-1": 2}  # the most ever at once, not the count now
    assert state["faults_served"] == {"list:500": 2, "create:hang": 1}


# -- several pods, one Ray cluster: global networking and network volumes ---------------------------
HEAD_ADDRESS = "FLEET_RAY_HEAD_ADDRESS"
DEPLOY_NET = """
mutation Deploy($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id globalNetwork networkVolumeId }
}
"""


def deploy_on_network(
    fake: FakeRunPod, name: str, env: dict[str, str], network: bool = True, volume: str | None = None
) -> dict[str, Any]:
    """Create a pod the way the fleet does for a multi-node run (raw GraphQL: the SDK has no global
    network); answers the created pod, or the GraphQL error body."""
    spec: dict[str, Any] = {
        "name": name,
        "imageName": "img",
        "gpuTypeId": GPU,
        "gpuCount": 1,
        "cloudType": "SECURE",
        "globalNetwork": network,
        "env": [{"key": k, "value": v} for k, v in env.items()],
    }
    if volume is not None:
        spec["networkVolumeId"] = volume
    body: dict[str, Any] = gql(fake, DEPLOY_NET, {"input": spec}).json()
    return body["data"]["podFindAndDeployOnDemand"] if body.get("data") else body


def alive_ray_nodes(dashboard_port: int, token: str) -> int:
    """How many ALIVE nodes the head's State API lists."""
    reply = requests.get(
        f"http://127.0.0.1:{dashboard_port}/api/v0/nodes",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    reply.raise_for_status()
    return sum(row["state"] == "ALIVE" for row in reply.json()["data"]["result"]["result"])


def test_network_volumes_and_global_network_render_back(fake: FakeRunPod) -> None:
    refused = deploy_on_network(fake, "tf-novol", {}, volume="vol-missing")
    assert "network volume vol-missing not found" in refused["errors"][0]["message"]
    added = requests.post(f"{fake.url}/_fake/network-volumes", json={"id": "vol-1"}, timeout=5)
    assert added.json() == {"network_volumes": ["vol-1"]}
    pod = deploy_on_network(fake, "tf-vol", {}, volume="vol-1")
    assert (pod["globalNetwork"], pod["networkVolumeId"]) == (True, "vol-1")
    query = "query P($input: PodFilter) { pod(input: $input) { id globalNetwork networkVolumeId } }"
    plain = runpod.create_pod("tf-plain", "img", GPU)["id"]
    got = gql(fake, query, {"input": {"podId": plain}}).json()["data"]["pod"]
    assert got == {"id": plain, "globalNetwork": False, "networkVolumeId": None}
    volumes = gql(fake, "{ myself { networkVolumes { id dataCenterId } } }").json()["data"]["myself"]
    assert volumes["networkVolumes"] == [{"id": "vol-1", "dataCenterId": "EU-RO-1"}]


def test_a_stuck_create_is_answered_but_never_boots(fake: FakeRunPod) -> None:
    fake.add_faults([{"op": "create", "kind": "stuck"}])
    stuck, ok = (runpod.create_pod(name, "img", GPU)["id"] for name in ("tf-stuck-1", "tf-ok-1"))
    assert wait_running(ok)["runtime"]["ports"]
    # The stuck pod was created first: booting, it would be running now that the later one is.
    pod = runpod.get_pod(stuck)
    assert (pod["desiredStatus"], pod["runtime"]) == ("RUNNING", None)
    assert isinstance(fake.nodes, Fronted) and isinstance(nodes := fake.nodes.inner, NoNodes)
    assert f"runpod-{stuck}" not in nodes and f"runpod-{ok}" in nodes  # its node never started
    assert fake.state()["faults_served"] == {"create:stuck": 1}
    with pytest.raises(ValueError, match="for the create op"):
        fake.add_faults([{"op": "list", "kind": "stuck"}])


@pytest.mark.timeout(240)
def test_pods_on_the_global_network_make_one_ray_cluster_on_a_shared_volume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's pods as the fleet rents them: a head pod, and a worker pod created at once (its head still
    boots) that joins the head's Ray cluster over the global network; both keep their runs on the same
    network volume. A pod off the global network never joins, though it shows running."""
    token = "fake-ray-token-0123456789"
    heads = LocalHeads(tmp_path / "nodes")
    with pytest.raises(ValueError, match="not a head"):
        heads.join("nowhere", "no-such-head", num_cpus=1, num_gpus=0, env={})
    with FakeRunPod(api_key=KEY, home=tmp_path, nodes="ray", node_cpus=1) as server:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", server.url)
        monkeypatch.setattr(runpod, "api_key", KEY)
        server.add_network_volume("vol-1")
        head = deploy_on_network(server, "tf-mn-0", {"FLEET_RAY_TOKEN": token}, volume="vol-1")["id"]
        join = {"FLEET_RAY_TOKEN": token, HEAD_ADDRESS: f"{head}.runpod.internal:6379"}
        worker = deploy_on_network(server, "tf-mn-1", join, volume="vol-1")["id"]
        names = [f"runpod-{head}", f"runpod-{worker}"]

        port = wait_running(head, timeout=120)["runtime"]["ports"][0]["publicPort"]
        deadline = time.monotonic() + 120
        while alive_ray_nodes(port, token) < 2:
            assert time.monotonic() < deadline, "the worker pod's node never joined the head's cluster"
            time.sleep(0.5)
        assert wait_running(worker, timeout=10)["runtime"]["ports"]
        metas = [meta for name in names if (meta := heads.read(name))]
        assert [meta.head for meta in metas] == [None, names[0]]
        roots = [psutil.Process(meta.pid).environ()[NODE_ROOT_ENV] for meta in metas]
        assert roots == [str(server.volume_dir("vol-1") / "trainfleet")] * 2

        stray = deploy_on_network(server, "tf-mn-2", join, network=False)["id"]
        wait_running(stray)
        assert isinstance(server.nodes, Fronted) and isinstance(nodes := server.nodes.inner, RayNodes)
        assert nodes.stranded(f"runpod-{stray}")  # decided at its start: it will never join
        assert heads.read(f"runpod-{stray}") is None and alive_ray_nodes(port, token) == 2

        for pod_id in (worker, stray, head):
            runpod.terminate_pod(pod_id)
        left = [proc.pid for meta in metas for proc in heads.processes(meta)]  # before the fake's cleanup
    assert left == [], f"Ray processes outlived their pods: {left}"


def test_an_input_runpod_would_refuse_is_an_error_and_creates_nothing(fake: FakeRunPod) -> None:
    """RunPod's GraphQL server checks every argument against its input types before doing anything: the
    fake does too (tests.fakes.runpod_schema), so a misspelled or mistyped create field fails here as there,
    instead of being copied into a pod."""
    client = RunPodClient(SecretStr(KEY), fake.url)
    spec: PodSpec = {**POD_SPEC, "name": "tf-s-1"}
    misspelled = {**spec, "terminateAfer": "2030-01-01T00:00:00+00:00"}
    with pytest.raises(RunPodAPIError, match='Field "terminateAfer" is not defined by type'):
        client.deploy_on_demand(misspelled)  # type: ignore[arg-type]
    with pytest.raises(RunPodAPIError, match="Int cannot represent non-integer value"):
        client.deploy_on_demand({**spec, "gpuCount": "1"})  # type: ignore[typeddict-item]
    with pytest.raises(RunPodAPIError, match="DateTime cannot represent"):
        client.deploy_on_demand({**spec, "terminateAfter": "in an hour"})
    with pytest.raises(RunPodAPIError, match=r'"PodRentInterruptableInput\.bidPerGpu" of required type'):
        client.rent_interruptable(spec)
    wrong_type = (
        "mutation D($input: PodRentInterruptableInput!) { podFindAndDeployOnDemand(input: $input) { id } }"
    )
    assert (
        "used in position expecting" in gql(fake, wrong_type, {"input": spec}).json()["errors"][0]["message"]
    )
    quoted_enum = (
        'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "' + GPU + '", cloudType: "ALL"}) { id } }'
    )
    assert "cannot represent non-enum value" in gql(fake, quoted_enum).json()["errors"][0]["message"]
    assert fake.state()["instances"] == []
    made = client.deploy_on_demand(
        {**spec, "terminateAfter": "2030-01-01T00:00:00+00:00", "globalNetwork": True}
    )
    assert made.id and len(fake.state()["instances"]) == 1  # the fleet's own fields pass


def test_runpod_ends_a_pod_at_its_terminate_after(fake: FakeRunPod) -> None:
    """The fleet sets RunPod's `terminateAfter` on every pod (its failsafe of last resort): RunPod ends the
    pod then, whatever the fleet does, and so does the fake, which only stored the field before."""
    client = RunPodClient(SecretStr(KEY), fake.url)
    spec: PodSpec = {**POD_SPEC, "name": "tf-t-1"}
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
    ends = client.deploy_on_demand({**spec, "terminateAfter": soon.isoformat()})
    stays = client.deploy_on_demand({**spec, "name": "tf-t-2", "terminateAfter": "2030-01-01T00:00:00Z"})
    assert {p.id for p in client.pods()} == {ends.id, stays.id}
    deadline = time.monotonic() + 10
    while ends.id in {p.id for p in client.pods()} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert dt.datetime.now(dt.UTC) >= soon  # not before its time
    assert [p.id for p in client.pods()] == [stays.id]
    assert [i["name"] for i in fake.state()["instances"]] == ["tf-t-2"]


def test_a_document_runpod_would_refuse_is_400_and_nothing_in_it_runs(fake: FakeRunPod) -> None:
    """RunPod validates the whole document before it runs any of it (tests.fakes.runpod_schema): a create
    whose selection misspells a field makes no pod, and neither does a valid create beside a field that
    does not fit, in the same document."""
    misspelled = (
        "mutation Deploy($input: PodFindAndDeployOnDemandInput!) "
        "{ podFindAndDeployOnDemand(input: $input) { id imageName desiredStatus machine { podHostID } } }"
    )
    refused = gql(fake, misspelled, {"input": POD_SPEC})
    assert refused.status_code == 400
    (error,) = refused.json()["errors"]
    assert error == {
        "message": 'Cannot query field "podHostID" on type "PodMachineInfo".',
        "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"},
    }
    create = 'podFindAndDeployOnDemand(input: {name: "tf-two-1", imageName: "img", gpuTypeId: "' + GPU + '"})'
    both = f'mutation {{ made: {create} {{ id }} ended: podTerminate(input: {{podId: "x"}}) {{ id }} }}'
    assert "must not have a selection" in gql(fake, both).json()["errors"][0]["message"]
    sdk_create = generate_pod_deployment_mutation("tf-sdk-1", "img", GPU)  # what runpod.create_pod sends
    assert "podHostId" in sdk_create
    with pytest.raises(runpod.error.QueryError, match='Cannot query field "podHostID"'):
        runpod.api.graphql.run_graphql_query(sdk_create.replace("podHostId", "podHostID"))
    client = RunPodClient(SecretStr(KEY), fake.url)
    with pytest.raises(RunPodAPIError, match='Cannot query field "bogus"') as caught:
        client.call("query Pods { myself { pods { id bogus } } }", None, PodsData)
    assert caught.value.status == 400
    assert fake.state()["instances"] == [] and fake.state()["requests"]["create"] == 3  # refused, not made
    assert gql(fake, misspelled.replace("podHostID", "podHostId"), {"input": POD_SPEC}).status_code == 200


def test_an_image_runpod_cannot_pull_never_boots_and_runpod_stops_the_pod(fake: FakeRunPod) -> None:
    """A pod of an image no one has shows RUNNING with no runtime while its host tries the pull, then RunPod
    stops it (EXITED, "Exited by Runpod"), naming no reason, as RunPod does; a test registers an image to
    use one the fake does not know."""
    missing = runpod.create_pod("tf-nope-1", "me/trainer:v2", GPU)["id"]
    pod = runpod.get_pod(missing)
    assert (pod["desiredStatus"], pod["runtime"]) == ("RUNNING", None)
    deadline = time.monotonic() + 10
    while (pod := runpod.get_pod(missing))["desiredStatus"] == "RUNNING":
        assert pod["runtime"] is None and time.monotonic() < deadline, "the pod was never stopped"
        time.sleep(0.05)
    assert pod["desiredStatus"] == "EXITED" and pod["lastStatusChange"].startswith("Exited by Runpod: ")
    assert pod["runtime"] is None
    fake.register_image("me/trainer:v2")
    assert wait_running(runpod.create_pod("tf-yes-1", "me/trainer:v2", GPU)["id"])["runtime"]["ports"]
    added = requests.post(f"{fake.url}/_fake/images", json={"name": "me/other:1"}, timeout=5)
    assert added.status_code == 200 and "me/other:1" in added.json()["images"]
