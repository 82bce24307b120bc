"""trainer.data: reading JSONL, alpaca masking, completion, truncation, the eval split, padding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.factories import TINY_DATA, train_config
from trainer.config import DatasetConfig
from trainer.data import (
    IGNORE_INDEX,
    Collator,
    Example,
    Record,
    alpaca_prompt,
    eval_count,
    load_records,
    split,
    tokenize,
)
from trainer.errors import DatasetError
from trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny(tmp_path_factory.mktemp("cache")))


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_alpaca_masks_the_prompt(tokenizer: Any) -> None:
    record = Record(alpaca_prompt("Add the two numbers.", "3 and 4"), "3 plus 4 is 7.")
    (example,) = tokenize([record], tokenizer, sequence_len=512, train_on_inputs=False)
    prompt_len = len(tokenizer(record.prompt)["input_ids"])
    target = tokenizer(record.completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert example.input_ids[0] == tokenizer.bos_token_id
    assert example.input_ids[prompt_len:] == target
    assert example.labels == [IGNORE_INDEX] * prompt_len + target
    assert tokenizer.decode(example.input_ids[prompt_len:], skip_special_tokens=True) == "3 plus 4 is 7."


def test_train_on_inputs_labels_everything(tokenizer: Any) -> None:
    record = Record(alpaca_prompt("Name the color of snow."), "The color of snow is white.")
    (example,) = tokenize([record], tokenizer, sequence_len=512, train_on_inputs=True)
    assert example.labels == example.input_ids


def test_alpaca_records_with_and_without_input(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "a.jsonl",
        [{"instruction": "Do it.", "input": "x", "output": "done"}, {"instruction": "Go.", "output": "ok"}],
    )
    first, second = load_records([DatasetConfig(path=str(path), type="alpaca")])
    assert first.prompt.endswith("### Instruction:\nDo it.\n\n### Input:\nx\n\n### Response:\n")
    assert "### Input" not in second.prompt and second.completion == "ok"


def test_completion_uses_its_field(tmp_path: Path, tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"content": "A cow says moo."}])
    (record,) = load_records([DatasetConfig(path=str(path), type="completion", field="content")])
    assert record == Record("", "A cow says moo.")
    (example,) = tokenize([record], tokenizer, sequence_len=512, train_on_inputs=False)
    assert example.input_ids[0] == tokenizer.bos_token_id
    assert example.input_ids[-1] == tokenizer.eos_token_id
    assert example.labels[1:] == example.input_ids[1:]  # only the BOS (an empty prompt's tokens) is masked


def test_truncation_and_dropping(tokenizer: Any) -> None:
    long = Record(alpaca_prompt("Count up from 1 by one, four numbers."), "1, 2, 3, 4.")
    examples = tokenize([long], tokenizer, sequence_len=16, train_on_inputs=False)
    assert len(examples[0].input_ids) == len(examples[0].labels) == 16
    assert all(label == IGNORE_INDEX for label in examples[0].labels)  # prompt longer than 16 tokens
    short = tokenize([Record("", "ok")], tokenizer, sequence_len=16, train_on_inputs=False)
    result = split(examples + short, val_set_size=0, seed=0)
    assert (len(result.train), result.dropped) == (1, 1)


@pytest.mark.parametrize(
    ("total", "size", "expected"), [(800, 0.1, 80), (100, 0.07, 7), (10, 0.01, 1), (50, 5, 5), (50, 0, 0)]
)
def test_eval_count(total: int, size: float, expected: int) -> None:
    assert eval_count(total, size) == expected


def test_eval_count_must_leave_training_examples() -> None:
    with pytest.raises(DatasetError, match="leaves no training examples"):
        eval_count(5, 5)


def test_split_is_deterministic_per_seed() -> None:
    examples = [Example([1, i], [1, i]) for i in range(100)]
    a, b, c = (split(examples, 0.1, seed) for seed in (42, 42, 7))
    assert (len(a.train), len(a.eval)) == (90, 10)
    assert a == b and a.eval != c.eval
    assert sorted(e.input_ids[1] for e in a.train + a.eval) == list(range(100))


def test_directory_and_data_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "b.jsonl", [{"text": "second"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "first"}])
    (tmp_path / "notes.txt").write_text("ignored")
    every = load_records([DatasetConfig(path=str(tmp_path), type="completion")])
    assert [r.completion for r in every] == ["first", "second"]
    relative = DatasetConfig(path=tmp_path.name, type="completion", data_files=["b.jsonl"])
    assert load_records([relative], base_dir=tmp_path.parent) == [Record("", "second")]


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        (None, {"path": "org/some-dataset"}, "hub datasets are not"),
        ("{not json", {}, r"x\.jsonl:1: not valid JSON"),
        ("[1, 2]", {}, "expected a JSON object"),
        ('{"instruction": "x"}', {}, r"row 1 of .*x\.jsonl has no `output`"),
        ('{"text": 3}', {"type": "completion"}, "has `text` as int, not a string"),
        ("\n", {}, "hold no records"),
        ('{"text": "x"}', {"data_files": "missing.jsonl"}, "directory"),
    ],
)
def test_unreadable_data_is_a_clear_error(
    tmp_path: Path, rows: str | None, kwargs: dict[str, Any], message: str
) -> None:
    if rows is not None:
        (tmp_path / "x.jsonl").write_text(rows, encoding="utf-8")
    values: dict[str, Any] = {"path": str(tmp_path / "x.jsonl"), **kwargs}
    with pytest.raises(DatasetError, match=message):
        load_records([DatasetConfig.model_validate(values)], base_dir=tmp_path)


def test_bundled_dataset(tokenizer: Any) -> None:
    config = train_config(val_set_size=0.1, sequence_len=128)
    records = load_records(config.datasets)
    assert len(records) == 800 and len(set(records)) == 800
    examples = tokenize(records, tokenizer, config.sequence_len, train_on_inputs=False)
    assert max(len(e.input_ids) for e in examples) < config.sequence_len  # nothing is cut off
    assert TINY_DATA.stat().st_size < 200_000


def test_collator_pads_on_the_right() -> None:
    batch = Collator(pad_id=0)([Example([1, 5, 6], [-100, 5, 6]), Example([1, 7], [-100, 7])])
    assert batch["input_ids"].tolist() == [[1, 5, 6], [1, 7, 0]]
    assert batch["labels"].tolist() == [[-100, 5, 6], [-100, 7, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
