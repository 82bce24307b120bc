"""Datasets: local JSONL in, tokenized train/eval examples and a padding collate out.

Three stages, each usable on its own:

1. `load_records` reads every `datasets:` entry (a .jsonl file, a directory of them, or `data_files` in a
   directory) into `Record`s: a prompt (masked unless `train_on_inputs`) and a completion. It needs no
   tokenizer, so `python -m trainer fetch` uses it to check a job's data before the GPU is busy.
2. `tokenize` turns records into `Example`s: the tokenizer's own special tokens in front (BOS for Llama),
   EOS appended, labels -100 over the prompt when `train_on_inputs` is false, cut to `sequence_len`.
3. `split` shuffles with the seed and takes the eval set off the front (`val_set_size`: fraction or count).

Relative dataset paths are resolved against `base_dir` (the process's working directory by default: the
Ray job's working_dir on the node).

A path that is not on this disk but reads as a hub id ('org/name', as jobs/spec.py keeps them) is a hub
dataset: `localize_datasets` downloads its JSONL files (trainer.download, into ``<cache_dir>/hub/``) and
returns the entries with an extra `local_copy` key naming that directory (`path` keeps the id, for the
model card); the stages above then read it like any local directory. Like the base model's directory,
the copy is on the node that ran `localize_datasets` (the Ray driver's). The files are `data_files` when
given, else the .jsonl files of the entry's `split`: those whose path names the split as a word
(``train.jsonl``, ``data/train-00000.jsonl``), or all of them for "train" when none names a split, as in
the `datasets` library. Only JSONL is read: a repo of parquet, CSV or JSON files is refused before
anything is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import HUB_ID_PATTERN, DatasetConfig, DatasetRef, TrainConfig
from trainer.errors import DatasetError, DownloadError

if TYPE_CHECKING:
    import torch

    from trainer.download import DownloadStats, HubAccess, Listing, RemoteFile

IGNORE_INDEX = -100  # label value the loss skips
LOCAL_COPY = "local_copy"  # the extra key localize_datasets sets on a hub entry: its directory on this node
_SPLIT_WORDS = ("train", "test", "validation", "valid", "dev", "eval")  # split names hub files carry
_OTHER_FORMATS = frozenset({".parquet", ".csv", ".tsv", ".json", ".arrow", ".txt", ".gz", ".zst", ".zip"})

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


@dataclass(frozen=True)
class Record:
    """One training text before tokenization: `prompt` (may be empty) followed by `completion`."""

    prompt: str
    completion: str


@dataclass(frozen=True)
class Example:
    """One tokenized example; `labels` has the same length as `input_ids`, -100 where not trained."""

    input_ids: list[int]
    labels: list[int]


@dataclass(frozen=True)
class Split:
    """The shuffled examples, eval set taken off the front; `dropped` counts examples with no label left."""

    train: list[Example]
    eval: list[Example]
    dropped: int = 0


def alpaca_prompt(instruction: str, input_: str = "") -> str:
    """The standard (Stanford) alpaca prompt, ending just before the response."""
    if input_:
        return PROMPT_WITH_INPUT.format(instruction=instruction, input=input_)
    return PROMPT_NO_INPUT.format(instruction=instruction)


def local_root(ds: DatasetConfig, base_dir: Path | None = None) -> Path:
    """Where the entry's files are on this disk: its `local_copy` once localized, else its path (relative
    paths under `base_dir`, default the working directory)."""
    copy = (ds.model_extra or {}).get(LOCAL_COPY)
    if copy:
        return Path(copy)
    root = Path(ds.path).expanduser()
    return root if root.is_absolute() else (base_dir or Path.cwd()) / root


def dataset_files(ds: DatasetConfig, base_dir: Path | None = None) -> list[Path]:
    """The JSONL files one `datasets:` entry names, in a stable order. Raises DatasetError if none."""
    root = local_root(ds, base_dir)
    if ds.data_files is not None:
        names = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files)
        if not root.is_dir():
            raise DatasetError(f"{ds.path}: data_files needs `path` to be a directory ({root} is not one)")
        files = [root / name for name in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DatasetError(f"{ds.path}: data_files not found: {', '.join(missing)}")
        return files
    if root.is_file():
        return [root]
    if root.is_dir():
        files = sorted(p for p in root.glob("*.jsonl") if p.is_file())
        if not files:
            raise DatasetError(f"{ds.path}: directory {root} holds no .jsonl files")
        return files
    raise DatasetError(
        f"dataset {ds.path!r} not found at {root}; local JSONL files and directories are read here "
        "(hub datasets are not: localize_datasets downloads them first)"
    )


def every_file(ds: DatasetRef, root: Path) -> list[Path]:
    """Every file of one `datasets:` entry found at `root` (any format, as axolotl reads them): the entry's
    `data_files` inside a directory, else every file under it, or the file itself. Raises DatasetError
    when a named data file is missing."""
    if ds.data_files is not None and root.is_dir():
        names = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files)
        missing = [n for n in names if not (root / n).exists()]
        if missing:
            raise DatasetError(f"{ds.path}: data_files not found in {root}: {', '.join(missing)}")
        return [root / n for n in names]
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]


def is_hub_dataset(ds: DatasetConfig, base_dir: Path | None = None) -> bool:
    """Whether `ds` names a hub dataset: not a local path (a shipped dataset may look like 'org/name' too)
    and shaped like a hub id."""
    return not local_root(ds, base_dir).exists() and re.fullmatch(HUB_ID_PATTERN, ds.path) is not None


def localize_datasets(
    datasets: Sequence[DatasetConfig],
    base_dir: Path | None = None,
    cache_dir: Path | None = None,
    access: HubAccess | None = None,
) -> tuple[list[DatasetConfig], list[DownloadStats]]:
    """The entries with every hub dataset downloaded under `cache_dir` (default: the model cache), its
    `local_copy` and `data_files` set; plus the download figures, one per hub dataset. `path` keeps the
    hub id, which is what the model card names.

    Local entries come back unchanged. `access` defaults to HF_ENDPOINT / HF_TOKEN from the environment.
    Raises DatasetError for a missing or refused repo, a failed download, or a repo without JSONL files.
    """
    if not any(is_hub_dataset(ds, base_dir) for ds in datasets):
        return list(datasets), []
    from trainer.download import HubAccess, snapshot
    from trainer.tiny import default_cache_dir

    local, stats = [], []
    for ds in datasets:
        if not is_hub_dataset(ds, base_dir):
            local.append(ds)
            continue
        try:
            access = access or HubAccess.from_env(os.environ)
            got = snapshot(
                ds.path, cache_dir or default_cache_dir(), access, "dataset", partial(hub_jsonl_files, ds)
            )
        except DownloadError as exc:
            raise DatasetError(f"dataset {ds.path!r} is not a local path; from the hub: {exc}") from exc
        local.append(
            ds.model_copy(update={LOCAL_COPY: str(got.path), "data_files": [f.path for f in got.files]})
        )
        stats.append(got.stats)
    return local, stats


def hub_jsonl_files(ds: DatasetConfig, listing: Listing) -> list[RemoteFile]:
    """The files of a hub dataset that `ds` reads (see the module docstring). Raises DatasetError."""
    by_path = {f.path: f for f in listing.files}
    where = f"hub dataset {ds.path!r}"
    if ds.data_files is not None:
        names = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files)
        missing = [n for n in names if n not in by_path]
        if missing:
            raise DatasetError(f"{where}: data_files not in the repo: {', '.join(missing)}")
        other = [n for n in names if not n.endswith(".jsonl")]
        if other:
            raise DatasetError(f"{where}: only JSONL (.jsonl) is read; data_files names {', '.join(other)}")
        return [by_path[n] for n in names]
    jsonl = [f for f in listing.files if f.path.endswith(".jsonl")]
    if not jsonl:
        kinds = sorted({Path(f.path).suffix for f in listing.files if Path(f.path).suffix in _OTHER_FORMATS})
        found = f" (it has {', '.join(kinds)} files)" if kinds else ""
        raise DatasetError(
            f"{where} has no .jsonl files{found}; only JSONL is read: convert the data to JSON Lines"
        )
    named = [f for f in jsonl if _names_split(f.path, ds.split)]
    if named:
        return named
    if ds.split == "train" and not any(_names_split(f.path, s) for f in jsonl for s in _SPLIT_WORDS):
        return jsonl
    paths = ", ".join(f.path for f in jsonl[:10])
    raise DatasetError(
        f"{where}: no .jsonl file for split {ds.split!r} among {paths}; name them with data_files"
    )


def _names_split(path: str, split: str) -> bool:
    """Whether `split` is a word of `path` ('data/train-00000.jsonl' names 'train', 'training.jsonl' not)."""
    return re.search(rf"(^|[/_.\- ]){re.escape(split)}([/_.\- 0-9]|$)", path) is not None


def read_jsonl(path: Path) -> Iterable[tuple[int, dict[str, object]]]:
    """Yield (line number, object) for every non-blank line; a line that is not a JSON object is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
        yield number, obj


def to_record(ds: DatasetConfig, obj: dict[str, object], where: str) -> Record:
    """One JSON object as a Record, per the dataset's `type`. Raises DatasetError on a missing field."""

    def text(key: str, *, required: bool) -> str:
        value = obj.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            raise DatasetError(f"{where}: `{key}` must be a string ({ds.type} dataset)")
        return value

    if ds.type == "alpaca":
        prompt = alpaca_prompt(text("instruction", required=True), text("input", required=False))
        return Record(prompt=prompt, completion=text("output", required=True))
    return Record(prompt="", completion=text(ds.field, required=True))


def load_records(datasets: Sequence[DatasetConfig], base_dir: Path | None = None) -> list[Record]:
    """Every record of every dataset, in file order. Raises DatasetError when nothing is readable."""
    records: list[Record] = []
    for ds in datasets:
        for path in dataset_files(ds, base_dir):
            records += [to_record(ds, obj, f"{path}:{n}") for n, obj in read_jsonl(path)]
    if not records:
        raise DatasetError("the datasets hold no records")
    return records


def tokenize(
    records: Sequence[Record], tokenizer: Any, sequence_len: int, train_on_inputs: bool
) -> list[Example]:
    """Tokenize `records` with a Hugging Face tokenizer (which adds its own leading special tokens, e.g.
    BOS); append EOS; label -100 over the prompt unless `train_on_inputs`; keep the first `sequence_len`
    tokens. Examples left with no trained token are kept here and dropped by `split`."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DatasetError("the tokenizer has no EOS token")
    prompts = tokenizer([r.prompt for r in records], add_special_tokens=True)["input_ids"]
    completions = tokenizer([r.completion for r in records], add_special_tokens=False)["input_ids"]
    examples = []
    for prompt, completion in zip(prompts, completions, strict=True):
        target = [*completion, eos]
        ids = [*prompt, *target]
        labels = ids.copy() if train_on_inputs else [IGNORE_INDEX] * len(prompt) + target
        examples.append(Example(input_ids=ids[:sequence_len], labels=labels[:sequence_len]))
    return examples


def eval_count(total: int, val_set_size: float) -> int:
    """How many of `total` examples go to eval: ceil(fraction * total) below 1, else the count itself."""
    if val_set_size <= 0:
        return 0
    # round() first: 0.07 * 100 is 7.000000000000001 in floating point, and ceil would make it 8
    n = math.ceil(round(val_set_size * total, 9)) if val_set_size < 1 else int(val_set_size)
    if n >= total:
        raise DatasetError(f"val_set_size {val_set_size} leaves no training examples out of {total}")
    return n


def split(examples: Sequence[Example], val_set_size: float, seed: int) -> Split:
    """Drop examples with no trained token, shuffle with `seed`, and take `eval_count` off the front."""
    kept = [e for e in examples if any(label != IGNORE_INDEX for label in e.labels)]
    if not kept:
        raise DatasetError("no example has a token to train on (is sequence_len shorter than the prompts?)")
    order = list(range(len(kept)))
    random.Random(seed).shuffle(order)
    shuffled = [kept[i] for i in order]
    n_eval = eval_count(len(shuffled), val_set_size)
    return Split(train=shuffled[n_eval:], eval=shuffled[:n_eval], dropped=len(examples) - len(kept))


def prepare(config: TrainConfig, tokenizer: Any, base_dir: Path | None = None) -> Split:
    """load_records -> tokenize -> split, with the job's settings."""
    records = load_records(config.datasets, base_dir)
    examples = tokenize(records, tokenizer, config.sequence_len, config.train_on_inputs)
    return split(examples, config.val_set_size, config.seed)


class Collator:
    """Pads a batch of Examples on the right: input_ids with `pad_id`, labels with -100, attention_mask 0."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: Sequence[Example]) -> dict[str, torch.Tensor]:
        import torch

        width = max(len(e.input_ids) for e in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, e in enumerate(batch):
            n = len(e.input_ids)
            ids[row, :n] = torch.tensor(e.input_ids, dtype=torch.long)
            labels[row, :n] = torch.tensor(e.labels, dtype=torch.long)
            mask[row, :n] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
