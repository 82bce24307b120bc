"""The types of RunPod's GraphQL arguments, as the RunPod fake checks them before it resolves anything.

A GraphQL server validates every argument against its schema: an input field the type does not define, a
value of the wrong scalar type, a missing required field or a variable declared with another type is an
error in `errors`, and nothing is done. The fake used to copy any `input` field into the pod, so a
misspelled create field (`terminateAfer`) passed every test; now it fails as it would at RunPod.

The input types are those of RunPod's published GraphQL spec (graphql-spec.runpod.io) for the fields
runpod-python 1.11/1.12 and the fleet send, and the others that spec lists for the same types. Not every
one is confirmed against RunPod: `globalNetwork` (the fleet's multi-node pods) is the name the fleet
sends, and RunPod's REST API calls the same thing `globalNetworking`.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from tests.fakes.graphql_lite import Enum, GraphQLError, Var

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
ARGUMENTS: dict[str, dict[str, dict[str, str]]] = {
    "Query": {
        "gpuTypes": {"input": "GpuTypeFilter"},
        "pod": {"input": "PodFilter"},
        "myself": {},
    },
    "Mutation": {
        "podFindAndDeployOnDemand": {"input": "PodFindAndDeployOnDemandInput"},
        "podRentInterruptable": {"input": "PodRentInterruptableInput!"},
        "podTerminate": {"input": "PodTerminateInput!"},
        "podStop": {"input": "PodStopInput!"},
        "podResume": {"input": "PodResumeInput!"},
        "podBidResume": {"input": "PodBidResumeInput!"},
    },
}
LOWEST_PRICE_ARGUMENTS = {"input": "GpuLowestPriceInput"}


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
