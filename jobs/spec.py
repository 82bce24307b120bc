"""The job spec: a user's axolotl-style YAML, validated into the training config plus one provider section.

A job file is an axolotl config with at most one provider section at the top level: ``local:``,
``runpod:`` or ``vastai:``. Without one, the job runs on the default provider, so a plain axolotl config is
a valid job. Its training part goes to the trainer jobs.trainer_choice picks (or the job names): the
builtin recipe's typed keys (`TrainConfig`), or axolotl's (`AxolotlConfig`: the fleet's keys typed, the rest
kept for axolotl).

`load_job` / `parse_job` either return a `LoadedJob` or raise `ConfigError` listing every problem found,
each with the key path as written in the YAML ("runpod.gpu_count", "datasets[0].type") and its line. They
raise nothing else. Keys trainfleet does not use are reported once, as one warning in the result.

This module holds the spec, the loading and the checks across keys (the provider section, misspelled
sections, dataset paths, what a node without GPUs cannot run); jobs.problems turns pydantic's errors into
those problems.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializeAsAny,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from core.errors import ConfigError, Problem
from jobs.code_keys import code_problems
from jobs.local_files import resolve_datasets, resolve_deepspeed
from jobs.node_fit import node_problems
from jobs.paths import (
    NODE_PATH_KEYS,
    Confinement,
    local_node_refusal,
)
from jobs.problems import line_of, validate_mapping
from jobs.secretscan import said_once, scan
from jobs.sections import (
    LocalSection,
    MachineSection,
    ProviderName,
    SectionBase,
    provider_names,
    section_models,
)
from jobs.topology import with_default_workers
from jobs.trainer_choice import TrainerChoice, choose
from jobs.yamlsafe import join_path, load_yaml, read_job_file
from trainer.config import AnyTrainConfig, AxolotlConfig, TrainConfig

_TRAIN_CONFIG: TypeAdapter[AnyTrainConfig] = TypeAdapter(AnyTrainConfig)


class JobSpec(BaseModel):
    """A validated job: the training config and the one provider section it runs with."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    train: AnyTrainConfig
    provider: ProviderName
    section: SerializeAsAny[SectionBase]  # the provider's own model (_section_for_provider), dumped whole

    @field_validator("train", mode="before")
    @classmethod
    def _train_for_trainer(cls, value: object) -> object:
        # From JSON or a dict dump (the ledger): the config of the trainer it names.
        return _TRAIN_CONFIG.validate_python(value) if isinstance(value, dict) else value

    @field_validator("section", mode="before")
    @classmethod
    def _section_for_provider(cls, value: object, info: ValidationInfo) -> object:
        provider = info.data.get("provider")
        if isinstance(value, dict) and isinstance(provider, ProviderName):
            return section_models()[provider].model_validate(value)
        return value

    @property
    def gpu_count(self) -> int:
        """GPUs of each node the job trains on (``num_gpus`` for local, ``gpu_count`` for rented machines;
        in a cluster whose head has its own shape, the other nodes')."""
        return _gpus(self.section)

    @property
    def head_gpu_count(self) -> int:
        """GPUs of the run's head node: `gpu_count`, or the head's own (`head:`) in a cluster that has one."""
        return _gpus(self.section.node_section(0))

    @property
    def one_shot(self) -> bool:
        """Whether the node is terminated when the run ends, even after a failure."""
        return self.section.one_shot

    @property
    def hub_repo(self) -> str | None:
        """Where the run's result is pushed (`hub_model_id`); None when it pushes nothing: no hub_model_id,
        or a run that only prepares its datasets (`prepare_ds_only`), which has no model to push."""
        return None if self.section.prepare_ds_only else self.train.hub_model_id

    @model_validator(mode="after")
    def _section_matches_provider(self) -> JobSpec:
        expected = section_models()[self.provider]
        if type(self.section) is not expected:
            raise ValueError(f"provider {self.provider} needs a {expected.__name__}")
        return self


def _gpus(section: SectionBase) -> int:
    if isinstance(section, LocalSection):
        return section.num_gpus
    return section.gpu_count if isinstance(section, MachineSection) else 0


@dataclass(frozen=True)
class LoadedJob:
    """A job file that passed validation: the spec, warnings for the user, and the file as given."""

    spec: JobSpec
    warnings: list[str]
    source: str
    text: str
    choice: TrainerChoice | None = None
    """The trainer and why (None only for a LoadedJob made in code)."""
    sweep: Any = None
    """The file's `sweep:` section as written (validated by service.sweep_load), or None."""
    lines: Mapping[str, int] = field(default_factory=dict)
    """The line of each key path in the file, for errors about the sweep section."""
    paths: Confinement | None = None
    """Where its local files may be (jobs.paths); shipping checks them again. None: nothing local."""


def load_job(
    path: Path,
    *,
    default_provider: str = "local",
    overrides: Mapping[str, Any] | None = None,
    data_roots: Sequence[Path] = (),
) -> LoadedJob:
    """Read and validate the job file at `path` (see `parse_job`); relative dataset paths are relative to
    the file's directory, and local files must be under it or a data root (jobs.paths). Raises
    `ConfigError` only, also when the file cannot be read, is too large or is not a regular file.
    """
    base_dir = path.absolute().parent
    return parse_job(
        read_job_file(path),
        source=str(path),
        base_dir=base_dir,
        default_provider=default_provider,
        overrides=overrides,
        paths=Confinement(base_dir, tuple(data_roots)),
    )


def parse_job(
    data: bytes,
    *,
    source: str,
    base_dir: Path,
    default_provider: str = "local",
    overrides: Mapping[str, Any] | None = None,
    paths: Confinement | None = None,
) -> LoadedJob:
    """Validate a job file's bytes into a `LoadedJob`.

    `source` names the file in errors; `base_dir` is where relative dataset paths are looked up (existing
    ones are made absolute). `paths` says where local files may be (default: under `base_dir` only).
    `overrides` replace top-level keys after parsing (``{"use_ray": True}``).
    `default_provider` is used when the file has no provider section. Every problem is collected and raised
    together as one `ConfigError`; nothing else is raised.
    """
    if default_provider not in provider_names():
        valid = ", ".join(provider_names())
        message = f"unknown default provider {default_provider!r}; valid: {valid}"
        raise ConfigError(source, [Problem("", message)])
    fallback = ProviderName(default_provider)
    doc = load_yaml(data, source=source)
    raw = dict(doc.data)
    lines = dict(doc.lines)
    for key, value in (overrides or {}).items():
        raw[key] = value
        lines = {p: n for p, n in lines.items() if p != key and not p.startswith((f"{key}.", f"{key}["))}

    secrets = scan(raw, lines)  # anywhere in the file, the sweep and the provider section too
    problems: list[Problem] = list(secrets)
    sweep = ({} if (value := raw.pop("sweep")) is None else value) if "sweep" in raw else None
    provider, section_data = _take_provider_section(raw, lines, fallback, problems)
    problems += _misspelled_sections(raw, lines)
    paths = paths or Confinement(base_dir)
    problems += resolve_datasets(raw, lines, base_dir, paths)
    problems += resolve_deepspeed(raw, lines, base_dir, paths, provider)
    if provider == ProviderName.LOCAL:
        problems += _on_this_machine(raw, lines, paths)
    choice, choice_problems = choose(raw, lines)
    trainer = choice.trainer if choice is not None else "builtin"
    model = AxolotlConfig if trainer == "axolotl" else TrainConfig
    typed: list[Problem] = []
    train = validate_mapping(model, {**raw, "trainer": trainer}, "", lines, typed)
    said = {p.path for p in choice_problems}  # a key the trainer does not implement: said once, not twice
    problems += choice_problems + [p for p in typed if p.path not in said]
    section = validate_mapping(section_models()[provider], section_data, provider.value, lines, problems)
    if section is not None and section.num_nodes > 1 and not section.MULTI_NODE.supported:
        where = join_path(provider.value, "num_nodes")
        message = f"{provider.value} cannot run on {section.num_nodes} machines: {section.MULTI_NODE.reason}"
        problems.append(Problem(where, message, line_of(lines, where)))
    elif section is not None:
        for key, message in section.cluster_problems():
            where = join_path(provider.value, key)
            problems.append(Problem(where, message, line_of(lines, where)))
    problems = said_once(secrets, problems)
    if problems or train is None or section is None:
        raise ConfigError(source, sorted(problems, key=lambda p: (p.line is None, p.line or 0)))

    spec = JobSpec(train=with_default_workers(train, provider, section), provider=provider, section=section)
    problems += node_problems(spec, lines)
    if problems or choice is None:  # (no choice: its problem is in the list)
        raise ConfigError(source, sorted(problems, key=lambda p: (p.line is None, p.line or 0)))
    warnings = []
    if choice.bookkeeping:
        warnings.append(
            f"{len(choice.bookkeeping)} key(s) that change nothing in how the builtin recipe trains are kept "
            "and passed through unchanged: " + ", ".join(choice.bookkeeping)
        )
    return LoadedJob(
        spec=spec,
        warnings=warnings,
        source=source,
        text=doc.text,
        choice=choice,
        sweep=sweep,
        lines=MappingProxyType(lines),
        paths=paths,
    )


def _on_this_machine(raw: dict[str, Any], lines: dict[str, int], paths: Confinement) -> list[Problem]:
    """A local job's node is this machine: what it reads as a path is confined too, and it may not run code
    of its choosing there (jobs.code_keys)."""
    refused = [(key, local_node_refusal(raw.get(key), paths)) for key in NODE_PATH_KEYS]
    return [Problem(key, why, lines.get(key)) for key, why in refused if why] + code_problems(raw, lines)


def format_problems(err: ConfigError) -> str:
    """One line per problem, ``source:line: key.path: message``, for people to read."""
    out = []
    for p in err.problems:
        where = f"{err.source}:{p.line}" if p.line is not None else err.source
        out.append(f"{where}: {p.path}: {p.message}" if p.path else f"{where}: {p.message}")
    return "\n".join(out)


def _take_provider_section(
    raw: dict[str, Any], lines: Mapping[str, int], fallback: ProviderName, problems: list[Problem]
) -> tuple[ProviderName, Any]:
    """Remove the provider sections from `raw`; return the provider to use and its section's data."""
    names = provider_names()
    found = [(ProviderName(key), raw.pop(key)) for key in list(raw) if key in names]
    if not found:
        return fallback, {}
    if len(found) > 1:
        listed = " and ".join(f"{name} (line {lines.get(name)})" for name, _ in found)
        last = found[-1][0].value
        message = f"only one provider section is allowed; found {listed}"
        problems.append(Problem(last, message, lines.get(last)))
    provider, section = found[0]
    if section is None:  # `runpod:` alone means "RunPod with every default".
        section = {}
    return provider, section


def _misspelled_sections(raw: Mapping[str, Any], lines: Mapping[str, int]) -> list[Problem]:
    """A top-level mapping whose name is close to a provider's (``RunPod:``, ``vast:``) is almost certainly a
    typo; passing it through would silently run the job on the default provider instead.
    """
    names = [p.value for p in provider_names()]
    problems = []
    for key, value in raw.items():
        if key in TrainConfig.model_fields or not (value is None or isinstance(value, dict)):
            continue
        squashed = re.sub(r"[-_ .]", "", key.lower())
        close = difflib.get_close_matches(squashed, names, n=1, cutoff=0.75)
        if close:
            message = f"unknown provider section {key!r} (did you mean {close[0]!r}?)"
            problems.append(Problem(key, message, lines.get(key)))
    return problems
