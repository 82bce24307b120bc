"""Datasets: data files in (trainer.rows), tokenized train/eval examples and a padding collate out.

Three stages, each usable on its own:

1. `load_records` reads every `datasets:` entry (a file, a directory of data files, `data_files` in a
   directory, or axolotl's `path: json` + `data_files`) into records as its `type` reads rows
   (trainer.formats): a `Record` (prompt, masked unless `train_on_inputs`, and completion), a
   `Conversation` or `Segments`. It needs no tokenizer, so `python -m trainer fetch` uses it to check a
   job's data before the GPU is busy.
2. `tokenize` turns records into `Example`s: for a Record the tokenizer's own special tokens in front (BOS
   for Llama), EOS appended, labels -100 over the prompt; chat data through its template (trainer.chat);
   cut to `sequence_len`.
3. `split` shuffles with the seed and takes the eval set off the front (`val_set_size`: fraction or count).

Relative dataset paths are resolved against `base_dir` (the process's working directory by default: the
Ray job's working_dir on the node).

A path that is not on this disk but reads as a hub id ('org/name', as jobs/spec.py keeps them) is a hub
dataset: `localize_datasets` downloads its data files (trainer.download, into ``<cache_dir>/hub/``) and
returns the entries with an extra `local_copy` key naming that directory (`path` keeps the id, for the
model card); the stages above then read it like any local directory. Like the base model's directory,
the copy is on the node that ran `localize_datasets` (the Ray driver's). The files are `data_files` when
given, else the files of the repo's first format among .jsonl, .parquet, .json, .csv, .arrow that belong
to the entry's `split`: those whose path names the split as a word (``train.jsonl``,
``data/train-00000.parquet``), or all of them for "train" when none names a split, as in the `datasets`
library. A repo with none of these formats is refused before anything is downloaded.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config import HUB_ID_PATTERN, DatasetConfig, DatasetRef, TrainConfig
from trainer.errors import DatasetError, DownloadError
from trainer.formats import CHAT_TYPES, Conversation, Segments, conversation_of, segments_of, text_of
from trainer.rows import BUILDERS, FORMATS, builder_of, data_files_in, read_jsonl, read_rows

__all__ = ["read_jsonl"]  # kept importable from here

if TYPE_CHECKING:
    import torch

    from trainer.download import DownloadStats, HubAccess, Listing, RemoteFile

IGNORE_INDEX = -100  # label value the loss skips
LOCAL_COPY = "local_copy"  # the extra key localize_datasets sets on a hub entry: its directory on this node
_SPLIT_WORDS = ("train", "test", "validation", "valid", "dev", "eval")  # split names hub files carry
_HUB_ORDER = (
    ".jsonl",
    ".parquet",
    ".json",
    ".csv",
    ".arrow",
)  # a hub dataset's files: the first format it has

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


AnyRecord = Record | Conversation | Segments  # one row, as its dataset's `type` reads it


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


def is_builder_entry(ds: DatasetRef, base_dir: Path | None = None) -> bool:
    """Whether `ds` is axolotl's `path: json` (csv, parquet, arrow) form: files in `data_files` read by that
    builder, their paths relative to the working directory."""
    root = Path(ds.path)
    return (
        ds.path in BUILDERS and not (root if root.is_absolute() else (base_dir or Path.cwd()) / root).exists()
    )


def dataset_files(ds: DatasetConfig, base_dir: Path | None = None) -> list[Path]:
    """The data files one `datasets:` entry names, in a stable order: a file, the files of known formats
    in a directory (rows.data_files_in), its `data_files`, or those of a `path: json` entry. Raises
    DatasetError if none."""
    root = local_root(ds, base_dir)
    if (
        ds.data_files is not None
        and is_builder_entry(ds, base_dir)
        and not (ds.model_extra or {}).get(LOCAL_COPY)
    ):
        names = [ds.data_files] if isinstance(ds.data_files, str) else list(ds.data_files)
        files = [p if p.is_absolute() else (base_dir or Path.cwd()) / p for p in map(Path, names)]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DatasetError(f"path: {ds.path}: data_files not found: {', '.join(missing)}")
        return files
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
        files = data_files_in(root)
        if not files:
            raise DatasetError(
                f"{ds.path}: directory {root} holds no .jsonl, .json, .csv, .parquet or .arrow files"
            )
        return files
    raise DatasetError(
        f"dataset {ds.path!r} not found at {root}; local files and directories are read here "
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
        other = [n for n in names if Path(n).suffix.lower() not in FORMATS]
        if other:
            raise DatasetError(f"{where}: data_files names {', '.join(other)}, of no format read here")
        return [by_path[n] for n in names]
    kinds = {Path(f.path).suffix.lower() for f in listing.files if not Path(f.path).name.startswith(".")}
    suffix = next((k for k in _HUB_ORDER if k in kinds), None)
    if suffix is None:
        raise DatasetError(f"{where} has no .jsonl, .parquet, .json, .csv or .arrow files")
    data = [f for f in listing.files if Path(f.path).suffix.lower() == suffix]
    named = [f for f in data if _names_split(f.path, ds.split)]
    if named:
        return named
    if ds.split == "train" and not any(_names_split(f.path, s) for f in data for s in _SPLIT_WORDS):
        return data
    paths = ", ".join(f.path for f in data[:10])
    raise DatasetError(
        f"{where}: no {suffix} file for split {ds.split!r} among {paths}; name them with data_files"
    )


def _names_split(path: str, split: str) -> bool:
    """Whether `split` is a word of `path` ('data/train-00000.jsonl' names 'train', 'training.jsonl' not)."""
    return re.search(rf"(^|[/_.\- ]){re.escape(split)}([/_.\- 0-9]|$)", path) is not None


def to_record(ds: DatasetConfig, obj: dict[str, object], where: str) -> AnyRecord:
    """One row as a record, per the dataset's `type` (trainer.formats). Raises RowError (a DatasetError)
    naming the row and what it lacks."""
    if ds.type in CHAT_TYPES:
        return conversation_of(ds, obj, where)
    if ds.type == "input_output":
        return segments_of(obj, where)
    if ds.type == "alpaca":
        instruction = text_of(obj, "instruction", where, required=True)
        output = text_of(obj, "output", where, required=True)
        prompt = alpaca_prompt(instruction, text_of(obj, "input", where, required=False))
        return Record(prompt=prompt, completion=output)
    return Record(prompt="", completion=text_of(obj, ds.field, where, required=True))


def load_records(datasets: Sequence[DatasetConfig], base_dir: Path | None = None) -> list[AnyRecord]:
    """Every record of every dataset, in file order. Raises DatasetError when nothing is readable."""
    records: list[AnyRecord] = []
    for ds in datasets:
        forced = ds.path if is_builder_entry(ds, base_dir) else None
        for path in dataset_files(ds, base_dir):
            builder = builder_of(path, forced)
            records += [to_record(ds, row, where) for where, row in read_rows(path, builder)]
    if not records:
        raise DatasetError("the datasets hold no records")
    return records


def tokenize(
    records: Sequence[AnyRecord],
    tokenizer: Any,
    sequence_len: int,
    train_on_inputs: bool,
    chat_template: str | None = None,
) -> list[Example]:
    """Tokenize `records` with a Hugging Face tokenizer; keep the first `sequence_len` tokens. A Record
    gets the tokenizer's leading special tokens (e.g. BOS) and EOS, labels -100 over the prompt unless
    `train_on_inputs`; a Conversation is rendered with `chat_template` (trainer.chat; needed when there is
    one) and trained on its chosen turns; Segments on their labelled parts. Examples left with no trained
    token are kept here and dropped by `split`."""
    from trainer.chat import tokenize_conversation, tokenize_segments

    eos = tokenizer.eos_token_id
    if eos is None:
        raise DatasetError("the tokenizer has no EOS token")
    plain = [r for r in records if isinstance(r, Record)]
    prompts = tokenizer([r.prompt for r in plain], add_special_tokens=True)["input_ids"] if plain else []
    completions = (
        tokenizer([r.completion for r in plain], add_special_tokens=False)["input_ids"] if plain else []
    )
    pairs = iter(zip(prompts, completions, strict=True))
    examples = []
    for record in records:
        if isinstance(record, Record):
            prompt, completion = next(pairs)
            ids = [*prompt, *completion, eos]
            labels = ids.copy() if train_on_inputs else [IGNORE_INDEX] * len(prompt) + [*completion, eos]
        elif isinstance(record, Segments):
            ids, labels = tokenize_segments(record, tokenizer, train_on_inputs)
        else:
            if chat_template is None:
                raise DatasetError(f"{record.where}: chat data needs a chat template")
            ids, labels = tokenize_conversation(
                record, tokenizer, chat_template, train_on_inputs, record.where
            )
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


def tokenized(config: TrainConfig, tokenizer: Any, base_dir: Path | None = None) -> list[Example]:
    """load_records -> tokenize, with the job's settings (trainer.prepared keeps the result)."""
    from trainer.chat import resolve_template

    records = load_records(config.datasets, base_dir)
    chat = any(isinstance(r, Conversation) for r in records)
    template = resolve_template(config, tokenizer, base_dir) if chat else None
    return tokenize(records, tokenizer, config.sequence_len, config.train_on_inputs, template)


def prepare(config: TrainConfig, tokenizer: Any, base_dir: Path | None = None) -> Split:
    """tokenized -> split, with the job's settings (no cache)."""
    return split(tokenized(config, tokenizer, base_dir), config.val_set_size, config.seed)


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
