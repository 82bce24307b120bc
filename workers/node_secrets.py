"""Which of the fleet's credentials a run's node gets, on a need-to-know basis, and why.

Whoever submits a job controls code on its node (`entry`, `image`, the trainer's keys), so whatever the
node holds, the submitter can read. A node therefore gets:

- HF_TOKEN only when the job needs it: it pushes to the Hub (`hub_model_id`), or it reads a repo the Hub
  does not serve to anyone (its base model, a hub dataset, an axolotl job's other hub reads). Whether a
  repo is public is asked of the Hub itself, anonymously, as the node is launched: 200 for a repo that is
  neither private nor gated means the node can do without the token; 401/403/404 means it needs it. When
  the Hub cannot be asked (a network error, a 5xx), nothing proves the token is not needed, so the node
  gets it and the log says why.
- WANDB_API_KEY only when the run writes its W&B run online (the plan made at provision: the job names a
  `wandb_project`, and its mode, or the fleet's, is online).

Neither vendor offers an API that mints a token scoped to one job, so what a node gets is the fleet's own
token; the rule above only decides whether it gets it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import requests
from pydantic import SecretStr

from state.models import Run
from trainer.config import BUILTIN_MODELS, HUB_ID_PATTERN, AxolotlConfig, FleetKeys, WandbPlan
from workers import context

log = logging.getLogger("trainfleet.workers")

HF_TOKEN = "HF_TOKEN"
WANDB_API_KEY = "WANDB_API_KEY"
HUB_PROBE_TIMEOUT_S = 10.0  # one anonymous look per repo, at launch
RepoKind = Literal["model", "dataset"]
# axolotl's keys that name more hub repos the node reads (besides base_model and datasets).
_AXOLOTL_MODEL_KEYS = ("base_model_config", "tokenizer_config", "lora_model_dir")
_AXOLOTL_DATASET_KEYS = ("test_datasets", "pretraining_dataset")


@dataclass(frozen=True)
class HubRead:
    """A hub repo the node downloads: its kind, id, and the job's key that names it."""

    kind: RepoKind
    repo_id: str
    key: str


class Visibility(StrEnum):
    """What an anonymous look at a repo says."""

    PUBLIC = "public"  # anyone may download it: the node needs no token for it
    NOT_PUBLIC = "not public"  # private, gated, or unknown to an anonymous caller
    UNKNOWN = "unknown"  # the Hub could not be asked


@dataclass(frozen=True)
class Grant:
    """One credential's decision: whether the node gets it, and why (for the log; never its value)."""

    name: str
    given: bool
    why: str
    sure: bool = True  # False: given because the Hub could not say whether it is needed


def hub_reads(train: FleetKeys) -> list[HubRead]:
    """The hub repos the job's node reads: its base model (unless built in or a path) and its hub
    datasets; an axolotl job's other repo keys too. Local paths were made absolute at validate."""
    reads: list[HubRead] = []
    if train.base_model not in BUILTIN_MODELS and _hub_id(train.base_model):
        reads.append(HubRead("model", train.base_model, "base_model"))
    reads += [
        HubRead("dataset", ds.path, f"datasets[{i}].path")
        for i, ds in enumerate(train.datasets)
        if _hub_id(ds.path)
    ]
    if isinstance(train, AxolotlConfig):
        extra = train.model_extra or {}
        reads += [HubRead("model", extra[k], k) for k in _AXOLOTL_MODEL_KEYS if _hub_id(extra.get(k))]
        for key in _AXOLOTL_DATASET_KEYS:
            entries = extra.get(key)
            for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
                path = entry.get("path") if isinstance(entry, Mapping) else entry
                if _hub_id(path):
                    reads.append(HubRead("dataset", str(path), f"{key}[{i}].path"))
    return reads


def _hub_id(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(HUB_ID_PATTERN, value) is not None


def visibility(
    endpoint: str, read: HubRead, timeout_s: float = HUB_PROBE_TIMEOUT_S
) -> tuple[Visibility, str]:
    """Whether anyone may download `read`, as the Hub answers a request without a token (GET
    /api/models/<id> or /api/datasets/<id>); with the answer in words. A gated repo's info is public but
    its files are not, so it counts as not public."""
    url = f"{endpoint.rstrip('/')}/api/{read.kind}s/{read.repo_id}"
    try:
        reply = requests.get(url, timeout=timeout_s, headers={"Accept": "application/json"})
    except requests.RequestException as exc:
        return Visibility.UNKNOWN, f"the Hub could not be asked ({type(exc).__name__})"
    if reply.status_code in (401, 403, 404):
        return Visibility.NOT_PUBLIC, f"the Hub answers {reply.status_code} without a token"
    if reply.status_code != 200:
        return Visibility.UNKNOWN, f"the Hub answered {reply.status_code}"
    try:
        info = reply.json()
    except ValueError:
        return Visibility.UNKNOWN, "the Hub's answer is not JSON"
    if not isinstance(info, dict):
        return Visibility.UNKNOWN, "the Hub's answer is not a repo's info"
    if info.get("private") or info.get("gated"):
        return Visibility.NOT_PUBLIC, "private" if info.get("private") else "gated"
    return Visibility.PUBLIC, "public"


def hf_grant(
    train: FleetKeys, push_to: str | None, endpoint: str, timeout_s: float = HUB_PROBE_TIMEOUT_S
) -> Grant:
    """Whether the node needs HF_TOKEN: to push (to `push_to`, the job's hub_model_id unless it pushes
    nothing: JobSpec.hub_repo), or to read a repo that is not public, or when the Hub cannot say (given,
    rather than a run that fails on a private repo)."""
    if push_to:
        return Grant(HF_TOKEN, True, f"the job pushes to the Hub (hub_model_id {push_to})")
    for read in hub_reads(train):
        seen, said = visibility(endpoint, read, timeout_s)
        if seen != Visibility.PUBLIC:
            return Grant(
                HF_TOKEN, True, f"{read.key} {read.repo_id}: {said}", sure=seen != Visibility.UNKNOWN
            )
    return Grant(HF_TOKEN, False, "the job neither pushes to the Hub nor reads a repo that is not public")


def wandb_grant(planned: WandbPlan | None) -> Grant:
    """Whether the node needs WANDB_API_KEY: only to write its W&B run online."""
    if planned is None:
        return Grant(WANDB_API_KEY, False, "the job has no W&B run")
    if planned.mode != "online":
        return Grant(WANDB_API_KEY, False, f"its W&B run is {planned.mode}")
    return Grant(WANDB_API_KEY, True, f"its W&B run {planned.run_id} is online")


def grants(train: FleetKeys, push_to: str | None, planned: WandbPlan | None, hf_endpoint: str) -> list[Grant]:
    """The decision for each credential a node may get."""
    return [hf_grant(train, push_to, hf_endpoint), wandb_grant(planned)]


def node_secrets(ctx: context.Context, run: Run) -> dict[str, SecretStr]:
    """The credentials the run's node gets in its environment at start (never in a Ray job's runtime_env):
    only those it needs (see the module's docstring), each decision in the log with its reason."""
    found = ctx.provider_context.credentials
    given: dict[str, SecretStr] = {}
    for grant in grants(run.spec.train, run.spec.hub_repo, run.progress.wandb, ctx.settings.hf_endpoint):
        if grant.given and grant.name in found:
            given[grant.name] = found[grant.name]
            level = logging.INFO if grant.sure else logging.WARNING
            log.log(level, "run %s: its node gets %s: %s", run.run_id, grant.name, grant.why)
        elif grant.given:
            log.info(
                "run %s: its node would need %s (%s), which the fleet lacks",
                run.run_id,
                grant.name,
                grant.why,
            )
        else:
            log.info("run %s: its node does not get %s: %s", run.run_id, grant.name, grant.why)
    return given
