"""Eval samples (the proof of concept's log_eval, axolotl's eval_table_size): at each eval, a few eval
examples decoded as input, the model's greedy continuation and the label, written to
`<output_dir>/eval_samples.jsonl` (one line per sample, with its step) and to the W&B run as a table.
Rank 0 alone generates; the examples are the first `eval_table_size` of the eval set, the same each time,
so the table shows one prompt's answers improving.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.data import IGNORE_INDEX, Example

SAMPLES_FILE = "eval_samples.jsonl"


def table_size(configured: int, log_eval: bool | None) -> int:
    """The rows of each eval's table: the config's `eval_table_size`, or none when the section's
    `log_eval: false` turns the table off (true and unset keep the config's)."""
    return 0 if log_eval is False else configured


def split(example: Example) -> tuple[list[int], list[int]]:
    """(prompt ids, label ids): the prompt is what precedes the first trained token (or, when inputs are
    trained too, the first half)."""
    first = next((i for i, label in enumerate(example.labels) if label != IGNORE_INDEX), len(example.labels))
    if first == 0:
        first = max(1, len(example.input_ids) // 2)
    return example.input_ids[:first], example.input_ids[first:]


def generate(
    model: Any, tokenizer: Any, examples: Sequence[Example], max_new_tokens: int, device: Any
) -> list[dict[str, str]]:
    """Greedy continuations of each example's prompt, decoded with the label beside it."""
    import torch

    rows = []
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        for example in examples:
            prompt, label = split(example)
            ids = torch.tensor([prompt], dtype=torch.long, device=device)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
            )
            rows.append(
                {
                    "input": tokenizer.decode(prompt, skip_special_tokens=True),
                    "prediction": tokenizer.decode(out[0, len(prompt) :].tolist(), skip_special_tokens=True),
                    "label": tokenizer.decode(label, skip_special_tokens=True),
                }
            )
    if was_training:
        model.train()
    return rows


def append(output_dir: Path, step: int, rows: Sequence[dict[str, str]]) -> None:
    """Add one eval's rows to the JSONL file in the output directory."""
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / SAMPLES_FILE).open("a", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps({"step": step, **row}, ensure_ascii=False) + "\n")
