"""jobs.dataset_check: a local dataset whose rows its `type` cannot read fails validate, naming the key, its
line and the first bad row; empty and unreadable files too; hub datasets are left to the node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError, Problem
from jobs import dataset_check
from jobs.spec import LoadedJob, parse_job

HEAD = (
    "base_model: trainfleet/tiny-llama\nadapter: lora\ndatasets:\n  - path: data/{name}\n    type: {type}\n"
)
CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
ALPACA = {"instruction": "Say hi.", "output": "hi"}


def write(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> None:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def parse(tmp_path: Path, text: str) -> LoadedJob:
    return parse_job(text.encode(), source="job.yml", base_dir=tmp_path)


def problems(tmp_path: Path, text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, text)
    return err.value.problems


def test_a_wrong_type_names_the_key_its_line_and_the_first_bad_row(tmp_path: Path) -> None:
    write(tmp_path, "train.jsonl", [ALPACA, ALPACA, CHAT, CHAT])
    (problem,) = problems(tmp_path, HEAD.format(name="train.jsonl", type="alpaca"))
    assert (problem.path, problem.line) == ("datasets[0].type", 5)
    assert problem.message == (
        "alpaca needs `instruction` and `output`; row 3 of train.jsonl has no `instruction`"
    )
    write(tmp_path, "chat.jsonl", [CHAT, {"messages": [{"role": "bot", "content": "x"}]}])
    (chat,) = problems(tmp_path, HEAD.format(name="chat.jsonl", type="chat_template"))
    assert (
        chat.path == "datasets[0].type"
        and "row 2 of chat.jsonl (messages[0]) has the role 'bot'" in chat.message
    )


def test_good_data_of_each_type_passes(tmp_path: Path) -> None:
    write(tmp_path, "chat.jsonl", [CHAT] * 3)
    assert (
        parse(tmp_path, HEAD.format(name="chat.jsonl", type="chat_template")).spec.train.datasets[0].type
        == "chat_template"
    )
    write(tmp_path, "io.jsonl", [{"segments": [{"text": "a", "label": True}]}])
    parse(tmp_path, HEAD.format(name="io.jsonl", type="input_output"))
    parse(
        tmp_path, HEAD.format(name="", type="alpaca").replace("data/", "org/hub-data")
    )  # hub: not read here


def test_an_empty_or_unreadable_dataset_is_a_problem_of_its_path(tmp_path: Path) -> None:
    write(tmp_path, "empty.jsonl", [])
    (empty,) = problems(tmp_path, HEAD.format(name="empty.jsonl", type="alpaca"))
    assert (empty.path, empty.line, empty.message) == ("datasets[0].path", 4, "the dataset holds no rows")
    (tmp_path / "data" / "bad.parquet").write_bytes(b"PAR1 not really")
    (bad,) = problems(tmp_path, HEAD.format(name="bad.parquet", type="alpaca"))
    assert bad.path == "datasets[0].path" and bad.message.startswith(
        "bad.parquet: cannot read as parquet: ArrowInvalid"
    )


def test_only_the_head_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_check, "MAX_ROWS", 2)
    write(tmp_path, "train.jsonl", [ALPACA, ALPACA, CHAT])
    job = parse(tmp_path, HEAD.format(name="train.jsonl", type="alpaca"))  # row 3 is past the head
    found = dataset_check.check_datasets(job.spec, job.lines)
    assert found.problems == []
    assert found.notes == ["datasets[0]: checked the first 2 rows; stopped in train.jsonl"]
    write(tmp_path, "a.jsonl", [ALPACA, ALPACA])
    directory = parse(tmp_path, HEAD.format(name="", type="alpaca"))
    assert dataset_check.check_datasets(directory.spec, directory.lines).notes == [
        "datasets[0]: checked the first 2 rows (0 MB); train.jsonl and after not read"
    ]


def test_axolotl_jobs_are_checked_only_where_axolotl_reads_the_same(tmp_path: Path) -> None:
    write(tmp_path, "train.jsonl", [CHAT])
    axolotl = "trainer: axolotl\n" + HEAD
    (problem,) = problems(tmp_path, axolotl.format(name="train.jsonl", type="alpaca"))
    assert problem.path == "datasets[0].type" and "has no `instruction`" in problem.message
    parse(tmp_path, axolotl.format(name="train.jsonl", type="alpaca_chat.load_qa"))  # its fields: axolotl's
