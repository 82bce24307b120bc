"""The vendor fakes refuse what the vendor would refuse, before they act, and nothing the real libraries or
the fleet send: the RunPod fake validates a whole GraphQL document against RunPod's schema
(tests.fakes.runpod_schema), the vast.ai fake a mutating call's body against the fields vast.ai documents
(tests.fakes.vastai_bodies), and both pull only the images they know (tests.fakes.node_images). No
server here: the checks themselves, against the documents and bodies the clients build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from runpod.api.mutations import pods as pod_mutations
from runpod.api.queries import gpus as gpu_queries
from runpod.api.queries import pods as pod_queries
from runpod.api.queries import user as user_queries
from vastai.api.instances import build_create_instance_payload
from vastai.data.instance import InstanceConfig

from providers.onnode.failsafe import RUNPOD_TERMINATE
from providers.runpod import client as fleet_runpod
from tests.fakes.graphql_lite import named_type, parse
from tests.fakes.node_images import DEFAULT_IMAGE, KNOWN_IMAGES, NO_PEFT_IMAGE, ImageRegistry
from tests.fakes.runpod import FakeRunPod
from tests.fakes.runpod_schema import OUTPUTS, ValidationFailed, validate
from tests.fakes.vastai_bodies import body_problem

GPU = "NVIDIA RTX A6000"
SPEC = {"name": "tf-1", "imageName": "img", "gpuTypeId": GPU, "gpuCount": 1, "cloudType": "ALL"}
DEPLOY = pod_mutations.generate_pod_deployment_mutation(
    "n", "img", GPU, gpu_count=1, volume_in_gb=0, container_disk_in_gb=10, min_vcpu_count=1,
    min_memory_in_gb=1, docker_args="sleep", ports="8265/http", volume_mount_path="/v", env={"A": "b"},
    template_id="t", network_volume_id="v", allowed_cuda_versions=["12.1"], min_download=1, min_upload=1,
)  # fmt: skip
# Every document runpod-python (its api/queries and api/mutations/pods.py) and the fleet send, with the
# variables each is sent with.
SENT: dict[str, tuple[str, dict[str, Any]]] = {
    "runpod get_pods": (pod_queries.QUERY_POD, {}),
    "runpod get_pod": (pod_queries.generate_pod_query("abc"), {}),
    "runpod get_gpus": (gpu_queries.QUERY_GPU_TYPES, {}),
    "runpod get_gpu": (gpu_queries.generate_gpu_query(GPU, 2), {}),
    "runpod get_user": (user_queries.QUERY_USER, {}),
    "runpod create_pod": (DEPLOY, {}),
    "runpod stop_pod": (pod_mutations.generate_pod_stop_mutation("abc"), {}),
    "runpod resume_pod": (pod_mutations.generate_pod_resume_mutation("abc", 1), {}),
    "runpod terminate_pod": (pod_mutations.generate_pod_terminate_mutation("abc"), {}),
    "fleet gpu_types": (fleet_runpod.GPU_TYPES, {"lowest": {"gpuCount": 1}}),
    "fleet pods": (fleet_runpod.PODS, {}),
    "fleet deploy_on_demand": (fleet_runpod.ON_DEMAND, {"input": SPEC}),
    "fleet rent_interruptable": (fleet_runpod.SPOT, {"input": {**SPEC, "bidPerGpu": 0.3}}),
    "fleet terminate": (fleet_runpod.TERMINATE, {"input": {"podId": "abc"}}),
    "failsafe terminate": (RUNPOD_TERMINATE, {"input": {"podId": "abc"}}),
}


@pytest.mark.parametrize("name", sorted(SENT))
def test_what_runpod_python_and_the_fleet_send_fits_runpods_schema(name: str) -> None:
    document, variables = SENT[name]
    validate(parse(document), variables)


@pytest.mark.parametrize(
    ("document", "variables", "message"),
    [
        (  # a create whose selection misspells a field: refused whole, before the pod would be made
            "mutation D($input: PodFindAndDeployOnDemandInput!) "
            "{ podFindAndDeployOnDemand(input: $input) { id imageName machine { podHostID } } }",
            {"input": SPEC},
            'Cannot query field "podHostID" on type "PodMachineInfo".',
        ),
        ("{ myself { pods { id bogus } } }", {}, 'Cannot query field "bogus" on type "Pod".'),
        ("{ gpuTypes { id } podz { id } }", {}, 'Cannot query field "podz" on type "Query".'),
        (
            'mutation { podTerminate(input: {podId: "x"}) { id } }',
            {},
            'Field "podTerminate" must not have a selection since type "Void" has no subfields.',
        ),
        (
            "{ myself { pods { id runtime } } }",
            {},
            'Field "runtime" of type "PodRuntime" must have a selection of subfields.',
        ),
        (
            "{ gpuTypes { lowestPrice(input: {gpuCnt: 1}) { minimumBidPrice } } }",
            {},
            'Field "gpuCnt" is not defined by type "GpuLowestPriceInput".',
        ),
        ("{ myself { pods { id(full: true) } } }", {}, 'Unknown argument "full" on field "Pod.id".'),
        ("query P($p: PodFilter) { myself { id } }", {}, 'Variable "$p" is never used in operation "P".'),
        ("{ myself { id @include(if: 1) } }", {}, "Boolean cannot represent a non boolean value: 1"),
    ],
)
def test_a_document_runpod_would_refuse_is_refused_before_anything_runs(
    document: str, variables: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        validate(parse(document), variables)
    assert message in str(refused.value)
    assert refused.value.code == "GRAPHQL_VALIDATION_FAILED"


def test_a_variable_of_the_wrong_shape_is_a_bad_input() -> None:
    with pytest.raises(ValidationFailed, match='"terminateAfer" is not defined') as refused:
        validate(parse(fleet_runpod.ON_DEMAND), {"input": {**SPEC, "terminateAfer": "2030-01-01T00:00:00Z"}})
    assert refused.value.code == "BAD_USER_INPUT"


def test_the_runpod_fake_resolves_every_field_its_schema_declares(tmp_path: Path) -> None:
    """A field the schema declares but the fake does not fill would pass validation and then fail: every
    declared field of each type is in what the fake renders for it."""
    fake = FakeRunPod(home=tmp_path)  # not served: its resolvers are called as they are
    fake.add_network_volume("vol-1")
    pod = fake._create({"input": SPEC}, spot=False)
    fake.instances[pod["id"]].running_since = 1.0
    running = fake._render(fake.instances[pod["id"]], "running")
    rendered = {
        "Pod": running,
        "PodMachineInfo": running["machine"],
        "PodRuntime": running["runtime"],
        "PodRuntimePorts": running["runtime"]["ports"][0],
        "PodRuntimeGpus": running["runtime"]["gpus"][0],
        "PodRuntimeContainer": running["runtime"]["container"],
        "User": fake._myself({}),
        "NetworkVolume": fake._myself({})["networkVolumes"][0],
        "GpuType": fake._gpu_types({})[0],
        "LowestPrice": fake._gpu_types({})[0]["lowestPrice"]({}),
        "DataCenter": fake._queries()["dataCenters"]({})[0],
    }
    for type_name, fields in OUTPUTS.items():
        if type_name in ("Query", "Mutation"):
            assert set(fields) == set(fake._queries() if type_name == "Query" else fake._mutations())
            continue
        assert set(fields) <= set(rendered[type_name]), type_name
        for name, type_text in fields.items():  # an object type's value is an object, a leaf's is not
            value = rendered[type_name][name]
            value = value({}) if callable(value) else value  # a field taking arguments
            value = value[0] if isinstance(value, list) and value else value
            assert (named_type(type_text) in OUTPUTS) == isinstance(value, dict), f"{type_name}.{name}"


def test_the_vastai_bodies_the_library_builds_are_taken() -> None:
    fleet = build_create_instance_payload(  # as providers.vastai.client.create_instance calls it
        image="img", disk=20, env={"A": "b", "-p 8265:8265": "1"}, label="tf-1", onstart_cmd="sh -c x",
        bid_price=0.3, ssh=True, direct=True,
    )  # fmt: skip
    taken = [
        ("create", fleet),
        ("create", build_create_instance_payload(image="img", args=["a"])),
        ("create", build_create_instance_payload(image="img", jupyter=True, jupyter_dir="/w", user="u")),
        ("create", InstanceConfig(image="img", args_str="x", target_state="stopped").to_dict()),
        ("stop", {"state": "stopped"}),
        ("resume", {"state": "running"}),
        ("label", {"label": "tf-2"}),
        ("bid", {"client_id": "me", "price": 0.4}),
        ("attach_ssh", {"ssh_key": "ssh-ed25519 AAAA"}),
        ("terminate", {}),
    ]
    assert [(op, body_problem(op, body)) for op, body in taken] == [(op, None) for op, _body in taken]


@pytest.mark.parametrize(
    ("op", "body", "message"),
    [
        ("create", {"client_id": "me", "image": "img", "labl": "tf-1"}, "unknown field(s) labl;"),
        ("create", {"imagee": "img"}, "unknown field(s) imagee;"),
        ("create", {"image": "img", "onstart_cmd": "x"}, "unknown field(s) onstart_cmd;"),  # the SDK's name
        ("create", {"image": "img", "disk": "20"}, "field disk must be an integer or a number, not str"),
        ("create", {"image": "img", "price": True}, "field price must be"),
        ("create", {"label": "tf-1"}, "image is required"),
        ("create", {"image": "img", "runtype": "ssh_direct"}, "invalid runtype 'ssh_direct'"),
        ("stop", {"state": "stoped"}, "invalid state 'stoped'"),
        ("label", {"label": "tf-1", "colour": "red"}, "unknown field(s) colour;"),
        ("bid", {"client_id": "me"}, "missing required field(s) price"),
        ("terminate", {"force": True}, "unknown field(s) force;"),
    ],
)
def test_a_vastai_body_with_what_its_call_does_not_take_is_refused(op: str, body: Any, message: str) -> None:
    problem = body_problem(op, body)
    assert problem is not None and message in problem


def test_a_fake_pulls_only_the_images_it_knows() -> None:
    images = ImageRegistry()
    assert images.runs_as(DEFAULT_IMAGE) == DEFAULT_IMAGE and images.runs_as("img:1") == DEFAULT_IMAGE
    assert images.pull_error(NO_PEFT_IMAGE) is None
    error = images.pull_error("me/trainer:v2")
    assert error is not None and "pull access denied for me/trainer, repository does not exist" in error
    assert images.runs_as("me/trainer:v2") is None and images.pull_error(None) is not None
    images.register("me/trainer:v2", like=NO_PEFT_IMAGE)
    assert images.runs_as("me/trainer:v2") == NO_PEFT_IMAGE and "me/trainer:v2" not in KNOWN_IMAGES
    with pytest.raises(ValueError, match="no such known image"):
        images.register("me/other:1", like="me/unknown:1")
    assert images.register_from({"name": "me/third:1"}) == (200, {"images": sorted(images.known)})
    assert images.register_from({"like": DEFAULT_IMAGE})[0] == 400
