"""The keys that make a trainer import code the job chose, refused for jobs whose node is this machine.

A local node runs on the fleet's own machine (in a sandbox: providers.local.sandbox), where a job gets the
node's software and its own data, not a way to run code of its choosing. axolotl imports Python named by a
job in several places; each is refused for a local job, with its key and line:
- `trust_remote_code: true` (the model's, or a dataset's): the Hub repo's (or a local model's `auto_map`)
  Python runs as the trainer;
- `plugins:`: axolotl imports each as a module;
- `trainer_cls:`: a class imported from a module path;
- `trl.reward_funcs`, `trl.rollout_func`: functions imported from module paths;
- a dataset `type:` with a dot whose first part is not one of axolotl's own prompt strategies
  (`mypackage.load` is imported as a module; `chat_template.default` is axolotl's);
- Python files among a local dataset's files: a sandboxed node's Ray job gets them as its working
  directory, which is on its import path, and a strategy name (`chatml.intel`) is looked up there first.
On a rented node the job's code runs on the job's own machine: these keys are allowed there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from core.errors import Problem
from jobs.problems import line_of
from jobs.yamlsafe import join_path

REFUSED = "runs code the job chose, which a job whose node is the fleet's own machine may not; rent a node"
CODE_KEYS = ("plugins", "trainer_cls")
TRL_CODE_KEYS = ("reward_funcs", "rollout_func")
DATASET_LISTS = ("datasets", "test_datasets", "pretraining_dataset")
CODE_SUFFIXES = (".py", ".pyc", ".pyw", ".so", ".pth")
MAX_FILES_LOOKED_AT = 100_000
# axolotl's own prompt strategy modules (0.19: axolotl/prompt_strategies and its dpo, kto, orpo, ebft,
# bradley_terry and messages packages): a dotted `type:` starting with one of these is axolotl's.
AXOLOTL_STRATEGIES = frozenset(
    {
        "alpaca_chat", "alpaca_instruct", "alpaca_w_system", "base", "bradley_terry", "chat", "chat_template",
        "chatml", "completion", "context_qa", "creative_acr", "dpo", "ebft", "ebft_chat_multiturn",
        "ebft_opencode", "ebft_pretrain", "ebft_reasoning", "ebft_strided_chat", "ebft_strided_structured",
        "input_output", "kto", "llama2_chat", "llama3", "messages", "metharme", "orcamini", "orpo",
        "passthrough", "pretrain", "pygmalion", "stepwise_supervised", "user_defined", "zephyr",
    }
)  # fmt: skip


def code_problems(raw: Mapping[str, Any], lines: Mapping[str, int]) -> list[Problem]:
    """What in a local job's top-level mapping `raw` (datasets resolved to absolute local paths) would
    import code of the job's choosing, each with its key and line."""
    problems: list[Problem] = []

    def refuse(path: str, why: str = REFUSED) -> None:
        problems.append(Problem(path, f"{path.rsplit('.', 1)[-1]}: {why}", line_of(dict(lines), path)))

    if raw.get("trust_remote_code"):
        refuse("trust_remote_code")
    for key in CODE_KEYS:
        if raw.get(key):
            refuse(key)
    trl = raw.get("trl")
    if isinstance(trl, Mapping):
        for key in TRL_CODE_KEYS:
            if trl.get(key):
                refuse(join_path("trl", key))
    for name in DATASET_LISTS:
        entries = raw.get(name)
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, Mapping):
                _dataset(entry, f"{name}[{i}]", refuse)
    return problems


def _dataset(entry: Mapping[str, Any], where: str, refuse: Callable[..., None]) -> None:
    """Refuse what in one dataset entry imports code: its trust_remote_code, a module-style type, Python
    among its local files."""
    if entry.get("trust_remote_code"):
        refuse(join_path(where, "trust_remote_code"))
    kind = entry.get("type")
    if isinstance(kind, str) and "." in kind and kind.split(".", 1)[0] not in AXOLOTL_STRATEGIES:
        refuse(join_path(where, "type"), f"{REFUSED} (`{kind}` names a Python module, not one of axolotl's)")
    files = entry.get("data_files")
    listed = [files] if isinstance(files, str) else files if isinstance(files, list) else []
    named = [("path", entry.get("path")), *(("data_files", f) for f in listed)]
    for key, value in named:
        if isinstance(value, str) and Path(value).is_absolute():
            code = _code_file(Path(value))
            if code is not None:
                why = f"{REFUSED}: it holds Python ({code.name}), which its node could import"
                refuse(join_path(where, key), why)
                return


def _code_file(root: Path) -> Path | None:
    """A Python file at or under `root` (a local dataset's file or directory), if any."""
    if root.is_file():
        return root if root.suffix in CODE_SUFFIXES else None
    for i, path in enumerate(root.rglob("*")):
        if i >= MAX_FILES_LOOKED_AT:
            return None
        if path.suffix in CODE_SUFFIXES:
            return path
    return None
