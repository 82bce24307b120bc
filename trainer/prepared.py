"""The builtin recipe's tokenized datasets, kept on the node's disk so a later run starts from them.

Tokenizing is the part of a run that needs no GPU and may take long (a large dataset, a slow tokenizer),
so its result is kept under ``<cache_dir>/prepared/<key>/`` (the node's cache: its root, or the network
volume a cloud mounts there): the examples as JSON Lines (`[input_ids, labels]`, before the eval split,
which is cheap and depends on the seed) and a small `meta.json`. The key is a digest of everything the
examples depend on: each dataset entry (less its path, which moves between nodes) and the bytes of its
files, `sequence_len`, `train_on_inputs`, the chat template's text, and the tokenizer as the run uses it
(its class, its vocabulary with the job's added tokens, its special tokens). A change to any of them is
another key, so a stale cache is never read; a torn write is never seen (written aside, then renamed).

`prepare_only` is the section's `prepare_ds_only: true`: tokenize into the cache, report what was prepared
(`prepared.json` in the output directory, and the FINISHED line's metrics) and stop without training.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer import lines
from trainer.config import TrainConfig, TrainJob
from trainer.data import Example, dataset_files, split, tokenized
from trainer.errors import DatasetError

FORMAT = 1  # of the cached files; a new layout is a new key
CACHE_DIR = "prepared"
EXAMPLES_FILE = "examples.jsonl"
META_FILE = "meta.json"
REPORT_FILE = "prepared.json"  # in the output directory of a prepare-only run


def cache_root(job: TrainJob) -> Path:
    """Where this node keeps prepared datasets: under the job's cache directory (its work_dir without one)."""
    return Path(job.cache_dir or job.work_dir) / CACHE_DIR


def template_text(config: TrainConfig, tokenizer: Any, base_dir: Path | None) -> str | None:
    """The chat template the job's chat data would be rendered with (None when it has none to use)."""
    from trainer.chat import resolve_template

    try:
        return resolve_template(config, tokenizer, base_dir)
    except DatasetError:
        return None


def key(config: TrainConfig, tokenizer: Any, base_dir: Path | None) -> str:
    """The digest of everything the tokenized examples depend on (the module's notes)."""
    digest = hashlib.sha256()
    entries = [ds.model_dump(mode="json", exclude={"path"}) for ds in config.datasets]
    said = {
        "format": FORMAT,
        "datasets": entries,
        "sequence_len": config.sequence_len,
        "train_on_inputs": config.train_on_inputs,
        "chat_template": template_text(config, tokenizer, base_dir),
        "tokenizer": type(tokenizer).__name__,
        "special": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
    }
    digest.update(json.dumps(said, sort_keys=True).encode())
    digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    for ds in config.datasets:
        for path in dataset_files(ds, base_dir):
            digest.update(b"\0file\0")
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()[:32]


def examples(
    config: TrainConfig, tokenizer: Any, base_dir: Path | None, root: Path | None, store: bool
) -> tuple[list[Example], Path | None, bool]:
    """The job's tokenized examples: read from `root`'s cache when they are there, else tokenized (and kept
    there when `store`). Returns them, their cache directory (None without a root) and whether it was read."""
    where = root / key(config, tokenizer, base_dir) if root is not None else None
    if where is not None:
        cached = _read(where)
        if cached is not None:
            print(f"trainer: datasets: {len(cached)} tokenized examples from {where}", file=sys.stderr)
            return cached, where, True
    found = tokenized(config, tokenizer, base_dir)
    if where is not None and store:
        _write(where, found)
        print(f"trainer: datasets: {len(found)} tokenized examples kept in {where}", file=sys.stderr)
    return found, where, False


def _read(where: Path) -> list[Example] | None:
    """The cached examples, or None when there are none (or they are not whole: the meta is written last)."""
    try:
        meta = json.loads((where / META_FILE).read_text(encoding="utf-8"))
        text = (where / EXAMPLES_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    rows = [json.loads(line) for line in text.splitlines() if line]
    if meta.get("format") != FORMAT or meta.get("examples") != len(rows):
        return None
    return [Example(input_ids=ids, labels=labels) for ids, labels in rows]


def _write(where: Path, found: Sequence[Example]) -> None:
    """Keep the examples under `where`: each file written aside and renamed, the meta last."""
    where.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps([e.input_ids, e.labels], separators=(",", ":")) + "\n" for e in found)
    _replace(where / EXAMPLES_FILE, body)
    _replace(where / META_FILE, json.dumps({"format": FORMAT, "examples": len(found)}) + "\n")


def _replace(path: Path, text: str) -> None:
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    aside.write_text(text, encoding="utf-8")
    os.replace(aside, path)


def prepare_only(job: TrainJob, model_path: Path, base_dir: Path) -> dict[str, Any]:
    """Tokenize the builtin job's datasets into the cache and stop: prepared.json in the output directory,
    a FINISHED line whose metrics count the examples; returns those metrics."""
    from transformers import AutoTokenizer

    from trainer import extras

    config = job.config
    if not isinstance(config, TrainConfig):
        raise TypeError(f"not a builtin job (trainer: {config.trainer})")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    extras.add_tokens(tokenizer, config)
    found, where, hit = examples(config, tokenizer, base_dir, cache_root(job), store=True)
    parts = split(found, config.val_set_size, config.seed)
    metrics: dict[str, Any] = {
        "prepared_examples": len(found),
        "train_examples": len(parts.train),
        "eval_examples": len(parts.eval),
        "dropped_examples": parts.dropped,
    }
    report(job, metrics, {"cache": str(where), "from_cache": hit})
    return metrics


def report(job: TrainJob, metrics: dict[str, Any], where: dict[str, Any]) -> None:
    """A prepare-only run's result: prepared.json (the metrics and where the data is kept) in the output
    directory, then the FINISHED line."""
    out = Path(job.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps({**metrics, **where, "trained": False}, indent=2) + "\n"
    (out / REPORT_FILE).write_text(text, encoding="utf-8")
    lines.emit(lines.Finished(metrics=metrics, output_dir=str(out)))
