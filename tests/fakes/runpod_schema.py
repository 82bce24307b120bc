"""RunPod's GraphQL schema as the RunPod fake checks a whole document against it before it resolves
anything (`validate`): the fields each output type has, and the types of their arguments.

A GraphQL server validates the whole document first: a selected field its type does not have, a leaf
field given a selection or an object field given none, an argument or input field the type does not
define, a value of the wrong scalar type, a missing required field, a variable declared with another type
or never used. Any of these is an answer with HTTP 400 and `errors` (RunPod's server: a create whose
input it refuses "returns HTTP 400 ... before anything is deployed", runpod/runpod-plugins-official#56;
runpod-python raises QueryError on any body with `errors`), and nothing is done. The fake used to copy
any `input` field into the pod and check the selection only while answering, after the pod was made, so
a misspelled create field (`terminateAfer`) or selected field (`machine { podHostID }`) passed every
test, or made a pod and then failed; now either fails as it would at RunPod, and nothing is created.

The output types are the fields the fake resolves, which cover every selection of runpod-python 1.11
(`runpod/api/queries`, `runpod/api/mutations/pods.py`), of the fleet (providers.runpod.client,
providers.onnode.failsafe) and of the tests. RunPod's types have more fields than these: a query asking for
one of those is refused here, which a test would show at once, where a lenient fake would hide a misspelling.
The type names are RunPod's where a client shows them (`Pod`, `PodRuntime`, `GpuType`); the nested
types' names only appear in error messages and `__typename`.

The input types are those of RunPod's published GraphQL spec (graphql-spec.runpod.io) for the fields
runpod-python 1.11/1.12 and the fleet send, and the others that spec lists for the same types. Not every
one is confirmed against RunPod: `globalNetwork` (the fleet's multi-node pods) is the name the fleet
sends, and RunPod's REST API calls the same thing `globalNetworking`.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from tests.fakes.graphql_lite import Enum, Field, GraphQLError, Operation, Var, named_type

ENUMS = {"CloudTypeEnum": frozenset({"ALL", "SECURE", "COMMUNITY"})}

_DEPLOY = {
    "aiApiId": "String",
    "allowedCudaVersions": "[String]",
    "cloudType": "CloudTypeEnum",
    "containerDiskInGb": "Int",
    "containerRegistryAuthId": "String",
    "countryCode": "String",
    "cudaVersion": "String",
    "dataCenterId": "String",
    "deployCost": "Float",
    "dockerArgs": "String",
    "env": "[EnvironmentVariableInput]",
    "globalNetwork": "Boolean",
    "gpuCount": "Int",
    "gpuTypeId": "String",
    "gpuTypeIdList": "[String]",
    "imageName": "String",
    "instanceId": "String",
    "minDisk": "Int",
    "minDownload": "Int",
    "minMemoryInGb": "Int",
    "minUpload": "Int",
    "minVcpuCount": "Int",
    "name": "String",
    "networkVolumeId": "String",
    "port": "Int",
    "ports": "String",
    "startJupyter": "Boolean",
    "startSsh": "Boolean",
    "stopAfter": "DateTime",
    "supportPublicIp": "Boolean",
    "templateId": "String",
    "terminateAfter": "DateTime",
    "volumeInGb": "Int",
    "volumeKey": "String",
    "volumeMountPath": "String",
}
INPUTS: dict[str, dict[str, str]] = {
    "PodFindAndDeployOnDemandInput": _DEPLOY,
    "PodRentInterruptableInput": {**_DEPLOY, "bidPerGpu": "Float!"},
    "EnvironmentVariableInput": {"key": "String!", "value": "String!"},
    "PodTerminateInput": {"podId": "String!"},
    "PodStopInput": {"podId": "String!", "incrementVersion": "Boolean"},
    "PodResumeInput": {"podId": "String!", "gpuCount": "Int", "syncMachine": "Boolean"},
    "PodBidResumeInput": {"podId": "String!", "bidPerGpu": "Float!", "gpuCount": "Int"},
    "PodFilter": {"podId": "String!"},
    "GpuTypeFilter": {"id": "String", "ids": "[String]"},
    "GpuLowestPriceInput": {
        "gpuCount": "Int",
        "minDisk": "Int",
        "minMemoryInGb": "Int",
        "minVcpuCount": "Int",
        "secureCloud": "Boolean",
        "dataCenterId": "String",
        "countryCode": "String",
        "minDownload": "Int",
        "minUpload": "Int",
        "cudaVersion": "String",
        "globalNetwork": "Boolean",
    },
}
# The arguments of each field that takes any, by type and field: a field not named here takes none.
ARGUMENTS: dict[str, dict[str, dict[str, str]]] = {
    "Query": {
        "gpuTypes": {"input": "GpuTypeFilter"},
        "pod": {"input": "PodFilter"},
    },
    "Mutation": {
        "podFindAndDeployOnDemand": {"input": "PodFindAndDeployOnDemandInput"},
        "podRentInterruptable": {"input": "PodRentInterruptableInput!"},
        "podTerminate": {"input": "PodTerminateInput!"},
        "podStop": {"input": "PodStopInput!"},
        "podResume": {"input": "PodResumeInput!"},
        "podBidResume": {"input": "PodBidResumeInput!"},
    },
    "GpuType": {"lowestPrice": {"input": "GpuLowestPriceInput"}},
}

_POD = {
    "id": "String!",
    "name": "String",
    "desiredStatus": "PodStatus",
    "lastStatusChange": "String",
    "costPerHr": "Float",
    "bidPerGpu": "Float",
    "podType": "PodType",
    "gpuCount": "Int",
    "imageName": "String",
    "env": "[String]",
    "containerDiskInGb": "Int",
    "volumeInGb": "Float",
    "volumeMountPath": "String",
    "dockerArgs": "String",
    "dockerId": "String",
    "ports": "String",
    "port": "Int",
    "memoryInGb": "Float",
    "vcpuCount": "Float",
    "machineId": "String",
    "machine": "PodMachineInfo",
    "uptimeSeconds": "Int",
    "globalNetwork": "Boolean",
    "networkVolumeId": "String",
    "runtime": "PodRuntime",
}
_PRICES = ("securePrice", "communityPrice", "secureSpotPrice", "communitySpotPrice")
_TERMS = ("oneWeekPrice", "oneMonthPrice", "threeMonthPrice")
# Each object type's fields and their types; a type not named here (String, Int, PodStatus...) is a leaf.
OUTPUTS: dict[str, dict[str, str]] = {
    "Query": {"gpuTypes": "[GpuType]", "pod": "Pod", "myself": "User", "dataCenters": "[DataCenter]"},
    "DataCenter": {"id": "String", "name": "String", "location": "String", "storageSupport": "Boolean"},
    "Mutation": {
        "podFindAndDeployOnDemand": "Pod",
        "podRentInterruptable": "Pod",
        "podTerminate": "Void",
        "podStop": "Pod",
        "podResume": "Pod",
        "podBidResume": "Pod",
    },
    "User": {"id": "String", "pubKey": "String", "pods": "[Pod]", "networkVolumes": "[NetworkVolume]"},
    "NetworkVolume": {"id": "String", "name": "String", "size": "Int", "dataCenterId": "String"},
    "Pod": _POD,
    "PodMachineInfo": {"gpuDisplayName": "String", "podHostId": "String"},
    "PodRuntime": {
        "uptimeInSeconds": "Int",
        "ports": "[PodRuntimePorts]",
        "gpus": "[PodRuntimeGpus]",
        "container": "PodRuntimeContainer",
    },
    "PodRuntimePorts": {
        "ip": "String",
        "isIpPublic": "Boolean",
        "privatePort": "Int",
        "publicPort": "Int",
        "type": "String",
    },
    "PodRuntimeGpus": {"id": "String", "gpuUtilPercent": "Int", "memoryUtilPercent": "Int"},
    "PodRuntimeContainer": {"cpuPercent": "Int", "memoryPercent": "Int"},
    "GpuType": {
        "id": "String!",
        "displayName": "String",
        "manufacturer": "String",
        "memoryInGb": "Int",
        "cudaCores": "Int",
        "maxGpuCount": "Int",
        "secureCloud": "Boolean",
        "communityCloud": "Boolean",
        **{name: "Float" for name in (*_PRICES, *_TERMS)},
        "lowestPrice": "LowestPrice",
    },
    "LowestPrice": {"minimumBidPrice": "Float", "uninterruptablePrice": "Float", "stockStatus": "String"},
}


class ValidationFailed(GraphQLError):
    """A document the server refuses before executing any of it (HTTP 400), with the code Apollo-style
    servers put in `extensions.code`."""

    def __init__(self, message: str, code: str = "GRAPHQL_VALIDATION_FAILED") -> None:
        super().__init__(message)
        self.code = code


def validate(operation: Operation, variables: dict[str, Any]) -> None:
    """ValidationFailed, with the message a GraphQL server gives, at the first thing in the whole document
    that does not fit RunPod's schema: its selections, arguments, directives and variables, before any
    field is resolved."""
    root = "Mutation" if operation.kind == "mutation" else "Query"
    try:
        used = _check_selections(root, operation.fields, operation.variables, variables)
    except ValidationFailed:
        raise
    except GraphQLError as exc:  # an argument's check (check_arguments): the same refusal
        raise ValidationFailed(str(exc), _code(str(exc))) from None
    for name in operation.variables:
        if name not in used:
            where = f' in operation "{operation.name}"' if operation.name else ""
            raise ValidationFailed(f'Variable "${name}" is never used{where}.')


def _code(message: str) -> str:
    """A variable's value that does not fit is a bad input (Apollo's BAD_USER_INPUT); the rest is the
    document's own fault."""
    return "BAD_USER_INPUT" if "got invalid value" in message else "GRAPHQL_VALIDATION_FAILED"


def _check_selections(
    parent: str, fields: list[Field], declared: dict[str, str], variables: dict[str, Any]
) -> set[str]:
    """Check each field selected on `parent` and, depth first, what it selects; returns the variables the
    selections use."""
    used: set[str] = set()
    for sel in fields:
        for directive, condition in sel.conditions:
            _check(condition, "Boolean!", declared, variables, f"@{directive}(if:)")
            used |= _variables_in(condition)
        used |= _variables_in(sel.args)
        if sel.name == "__typename":
            type_text = "String!"
        elif (found := OUTPUTS[parent].get(sel.name)) is None:
            raise ValidationFailed(f'Cannot query field "{sel.name}" on type "{parent}".')
        else:
            type_text = found
        wanted = ARGUMENTS.get(parent, {}).get(sel.name, {})
        check_arguments(parent, sel.name, wanted, sel.args, declared, variables)
        base = named_type(type_text)
        if base in OUTPUTS and sel.selections is None:
            message = f'Field "{sel.name}" of type "{type_text}" must have a selection of subfields.'
            raise ValidationFailed(f'{message} Did you mean "{sel.name} {{ ... }}"?')
        if base not in OUTPUTS and sel.selections is not None:
            message = f'Field "{sel.name}" must not have a selection since type "{type_text}"'
            raise ValidationFailed(f"{message} has no subfields.")
        if sel.selections is not None:
            used |= _check_selections(base, sel.selections, declared, variables)
    return used


def _variables_in(value: Any) -> set[str]:
    """The `$variables` a literal (an argument, an input object, a list) refers to."""
    if isinstance(value, Var):
        return {value.name}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return set().union(*(_variables_in(item) for item in items))


def check_arguments(
    parent: str, field: str, wanted: dict[str, str], raw: dict[str, Any], declared: dict[str, str],
    variables: dict[str, Any],
) -> None:  # fmt: skip
    """GraphQLError, with the message a GraphQL server gives, when an argument of `parent.field` does not
    fit its type. `raw`: the arguments as written (literals, `$variables`); `declared`: the operation's
    variable types."""
    for name, value in raw.items():
        if name not in wanted:
            raise GraphQLError(f'Unknown argument "{name}" on field "{parent}.{field}".')
        _check(value, wanted[name], declared, variables, f"{name}")
    for name, type_text in wanted.items():
        if type_text.endswith("!") and name not in raw:
            message = f'Field "{field}" argument "{name}" of type "{type_text}" is required'
            raise GraphQLError(message + ", but it was not provided.")


def _check(value: Any, type_text: str, declared: dict[str, str], variables: dict[str, Any], at: str) -> None:
    if isinstance(value, Var):
        have = declared.get(value.name)
        if have is None:
            raise GraphQLError(f'Variable "${value.name}" is not defined.')
        if not _fits(have, type_text):
            raise GraphQLError(
                f'Variable "${value.name}" of type "{have}" used in position expecting type "{type_text}".'
            )
        try:
            check_value(variables.get(value.name), type_text, literal=False)
        except GraphQLError as exc:
            raise GraphQLError(f'Variable "${value.name}" got invalid value; {exc}') from None
        return
    check_value(value, type_text, literal=True, declared=declared, variables=variables)


def _fits(have: str, want: str) -> bool:
    """Whether a variable declared `have` may stand where `want` is expected (GraphQL's rule: a non-null
    variable fits a nullable position, not the other way round)."""
    if have == want:
        return True
    return have.endswith("!") and not want.endswith("!") and _fits(have[:-1], want)


def check_value(
    value: Any, type_text: str, literal: bool, declared: dict[str, str] | None = None,
    variables: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """GraphQLError when `value` does not fit `type_text` (an input object, list, enum or scalar)."""
    base, non_null = type_text.removesuffix("!"), type_text.endswith("!")
    if value is None:
        if non_null:
            raise GraphQLError(f'Expected value of non-null type "{type_text}" not to be null.')
        return
    if isinstance(value, Var):  # a variable inside a literal (an object field, a list item)
        _check(value, type_text, declared or {}, variables or {}, base)
        return
    if base.startswith("["):
        for item in value if isinstance(value, list) else [value]:  # a single value is a list of one
            check_value(item, base[1:-1], literal, declared, variables)
    elif base in INPUTS:
        _check_object(value, base, literal, declared, variables)
    elif base in ENUMS:
        if literal and not isinstance(value, Enum):
            raise GraphQLError(f'Enum "{base}" cannot represent non-enum value: {json.dumps(value)}.')
        if str(value) not in ENUMS[base]:
            raise GraphQLError(f'Value "{value}" does not exist in "{base}" enum.')
    else:
        _check_scalar(value, base)


def _check_object(
    value: Any, base: str, literal: bool, declared: dict[str, str] | None, variables: dict[str, Any] | None
) -> None:
    fields = INPUTS[base]
    if not isinstance(value, dict):
        raise GraphQLError(f'Expected type "{base}" to be an object.')
    for key in value:
        if key not in fields:
            raise GraphQLError(f'Field "{key}" is not defined by type "{base}".')
    for key, type_text in fields.items():
        if type_text.endswith("!") and key not in value:
            raise GraphQLError(f'Field "{base}.{key}" of required type "{type_text}" was not provided.')
        if key in value:
            check_value(value[key], type_text, literal, declared, variables)


def _check_scalar(value: Any, base: str) -> None:
    shown = json.dumps(value) if not isinstance(value, Enum) else str(value)
    if base == "Int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise GraphQLError(f"Int cannot represent non-integer value: {shown}")
    if base == "Float" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise GraphQLError(f"Float cannot represent non numeric value: {shown}")
    if base in ("String", "ID") and (isinstance(value, Enum) or not isinstance(value, str)):
        raise GraphQLError(f"String cannot represent a non string value: {shown}")
    if base == "Boolean" and not isinstance(value, bool):
        raise GraphQLError(f"Boolean cannot represent a non boolean value: {shown}")
    if base == "DateTime":
        try:
            dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            ok = isinstance(value, str) and not isinstance(value, Enum)
        except ValueError:
            ok = False
        if not ok:
            raise GraphQLError(f"DateTime cannot represent an invalid date-time-string {shown}.")
