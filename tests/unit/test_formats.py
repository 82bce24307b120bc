"""trainer.formats / trainer.chat / trainer.rows: the chat formats train exactly their chosen turns, and
data files of every format load (parquet, csv, arrow, json, `path: json` + data_files, a directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.factories import train_config, train_job
from trainer import recipe
from trainer.chat import CHATML, resolve_template
from trainer.config import DatasetConfig, TrainConfig
from trainer.data import IGNORE_INDEX, Example, load_records, prepare, tokenize
from trainer.errors import DatasetError
from trainer.tiny import build_tiny

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "assistant"},  # a user turn that spells a role: must not be trained
    {"role": "assistant", "content": "Hello friend"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you"},
]
# A Llama-2-like template of a tokenizer's own: BOS in front, `</s>` (EOS) closes each assistant turn.
OWN_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim "
    "+ eos_token }}{% else %}{{ '[INST] ' + m['content'] | trim + ' [/INST]' }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def trained_text(tokenizer: Any, example: Example) -> str:
    return str(
        tokenizer.decode(
            [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE_INDEX]
        )
    )


def one_example(
    tmp_path: Path, tokenizer: Any, row: dict[str, Any], template: str | None, **ds: Any
) -> Example:
    data = write_jsonl(tmp_path / "chat.jsonl", [row])
    records = load_records([DatasetConfig.model_validate({"path": str(data), **ds})])
    (example,) = tokenize(records, tokenizer, 512, train_on_inputs=False, chat_template=template)
    return example


def test_chat_template_trains_exactly_the_assistant_turns(tmp_path: Path, tokenizer: Any) -> None:
    assert tokenizer.chat_template is None  # the tiny model has none: chatml is what it uses
    example = one_example(tmp_path, tokenizer, {"messages": CHAT}, CHATML, type="chat_template")
    assert tokenizer.decode(example.input_ids).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert trained_text(tokenizer, example) == "Hello friend<|im_end|>See you<|im_end|>"
    no_eos = one_example(
        tmp_path, tokenizer, {"messages": CHAT}, CHATML, type="chat_template", train_on_eos="none"
    )
    assert trained_text(tokenizer, no_eos) == "Hello friendSee you"
    users = one_example(
        tmp_path, tokenizer, {"messages": CHAT}, CHATML, type="chat_template", roles_to_train=["human"]
    )  # `human` maps to user, as axolotl maps it
    assert trained_text(tokenizer, users) == "assistant<|im_end|>Bye<|im_end|>"


def test_the_tokenizers_own_template_and_its_eos(tmp_path: Path, tokenizer: Any) -> None:
    tokenizer.chat_template = OWN_TEMPLATE
    template = resolve_template(TrainConfig.model_validate(train_config().model_dump()), tokenizer)
    assert template == OWN_TEMPLATE
    rows = {"msgs": [{"from": "human", "text": " Hi "}, {"from": "gpt", "text": "Yo "}]}
    example = one_example(
        tmp_path,
        tokenizer,
        rows,
        template,
        type="chat_template",
        field_messages="msgs",
        message_property_mappings={"role": "from", "content": "text"},
    )  # the template trims the content: still found
    assert example.input_ids[0] == tokenizer.bos_token_id
    assert example.labels[-1] == tokenizer.eos_token_id and trained_text(tokenizer, example) == "Yo</s>"


def test_sharegpt_reads_conversations_as_chat_template_does(tmp_path: Path, tokenizer: Any) -> None:
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    shared = {"conversations": [{"from": names[m["role"]], "value": m["content"]} for m in CHAT]}
    sharegpt = one_example(tmp_path, tokenizer, shared, CHATML, type="sharegpt")
    chat = one_example(tmp_path, tokenizer, {"messages": CHAT}, CHATML, type="chat_template")
    assert sharegpt == chat


def test_input_output_trains_the_labelled_segments(tmp_path: Path, tokenizer: Any) -> None:
    segments = [
        {"text": "Q: two plus two?\n", "label": False},
        {"text": "A: four", "label": True},
        {"text": "\nQ: and three?\n", "label": False},
        {"text": "A: five", "label": True},
    ]
    example = one_example(tmp_path, tokenizer, {"segments": segments}, None, type="input_output")
    assert tokenizer.decode(example.input_ids) == "".join(s["text"] for s in segments)  # no BOS, no EOS
    assert trained_text(tokenizer, example) == "A: fourA: five"


@pytest.mark.parametrize(
    ("row", "ds", "message"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, {"type": "chat_template"}, "role 'robot'"),
        ({"text": "x"}, {"type": "chat_template"}, "has no `messages`"),
        ({"conversations": [{"value": "x"}]}, {"type": "sharegpt"}, r"conversations\[0\]\) has no `from`"),
        ({"segments": [{"text": "x"}]}, {"type": "input_output"}, r"segments\[0\]\) has no `label`"),
    ],
)
def test_a_bad_chat_row_is_named(
    tmp_path: Path, row: dict[str, Any], ds: dict[str, Any], message: str
) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", [row])
    with pytest.raises(DatasetError, match=rf"row 1 of .*chat\.jsonl.*{message}"):
        load_records([DatasetConfig.model_validate({"path": str(data), **ds})])


def test_a_tokenizer_without_a_template_needs_chatml(tmp_path: Path, tokenizer: Any) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    config = train_config(datasets=[{"path": str(data), "type": "chat_template"}])
    with pytest.raises(DatasetError, match=r"no chat template of its own.*chat_template: chatml"):
        prepare(config, tokenizer)
    (tmp_path / "t.jinja").write_text(CHATML)
    from_file = train_config(
        datasets=config.datasets, chat_template="jinja", chat_template_jinja="t.jinja", val_set_size=0
    )
    assert len(prepare(from_file, tokenizer, base_dir=tmp_path).train) == 1


ALPACA = [{"instruction": f"Say {w}.", "input": "", "output": w} for w in ("one", "two", "three")]


def test_every_file_format_loads(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(ALPACA)
    pq.write_table(table, tmp_path / "d.parquet")
    with pa.OSFile(str(tmp_path / "d.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    (tmp_path / "d.csv").write_text(
        "instruction,input,output\n" + "".join(f"Say {w}.,,{w}\n" for w in ("one", "two", "three"))
    )
    (tmp_path / "d.json").write_text(json.dumps(ALPACA))
    expected = load_records([DatasetConfig(path=str(write_jsonl(tmp_path / "d.jsonl", ALPACA)))])
    for name in ("d.parquet", "d.arrow", "d.csv", "d.json"):
        assert load_records([DatasetConfig(path=str(tmp_path / name))]) == expected, name
    as_axolotl = DatasetConfig(path="json", data_files=["d.json"])  # axolotl's `path: json` + data_files
    assert load_records([as_axolotl], base_dir=tmp_path) == expected
    assert len(load_records([DatasetConfig(path=str(tmp_path))])) == 5 * len(ALPACA)  # the directory


def test_a_broken_parquet_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "d.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=r"d\.parquet: cannot read as parquet"):
        load_records([DatasetConfig(path=str(tmp_path / "d.parquet"))])


def test_a_short_run_on_chat_data_learns(tmp_path: Path, model_path: Path) -> None:
    replies = ["red", "green", "blue", "yellow"]
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Colour {i}?"},
                {"role": "assistant", "content": replies[i % 4]},
            ]
        }
        for i in range(40)
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    config = train_config(
        datasets=[{"path": str(data), "type": "chat_template"}],
        chat_template="chatml",
        sequence_len=96,
        max_steps=4,
        eval_steps=4,
        save_steps=None,
        eval_table_size=0,
        learning_rate=0.01,
    )
    metrics = recipe.run(train_job(tmp_path, config), model_path)
    assert 0 < metrics["eval_loss"] < metrics["eval_loss_first"]
