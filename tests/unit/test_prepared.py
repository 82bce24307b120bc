"""trainer.prepared: the builtin's tokenized datasets kept in the node's cache, found again by a later run
of the same data and tokenizer and never by another, and the prepare-only run (prepare_ds_only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.factories import TINY_DATA, train_config, train_job
from trainer import progress, recipe, samples, verbosity
from trainer.data import tokenized
from trainer.prepared import CACHE_DIR, EXAMPLES_FILE, META_FILE, REPORT_FILE, examples, key, prepare_only
from trainer.tiny import build_tiny


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path))


def test_prepare_only_tokenizes_into_the_cache_and_trains_nothing(
    tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = train_job(tmp_path, train_config(), prepare_only=True)
    metrics = prepare_only(job, model_path, tmp_path)
    said = list(progress.parse(capsys.readouterr().out))
    assert [r["kind"] for r in said] == ["finished"]  # no started, no step: nothing trained
    counts = {"prepared_examples": 800, "train_examples": 792, "eval_examples": 8, "dropped_examples": 0}
    assert metrics == counts
    assert said[0]["metrics"] == metrics
    out = Path(job.output_dir)
    assert sorted(p.name for p in out.iterdir()) == [REPORT_FILE]  # no adapter, no card
    report = json.loads((out / REPORT_FILE).read_text(encoding="utf-8"))
    assert report["trained"] is False and report["from_cache"] is False
    kept = Path(report["cache"])
    assert kept.parent == tmp_path / "cache" / CACHE_DIR
    assert (kept / META_FILE).is_file() and (kept / EXAMPLES_FILE).is_file()

    again = prepare_only(job, model_path, tmp_path)  # the same job a second time reads what the first kept
    assert again == metrics
    assert json.loads((out / REPORT_FILE).read_text(encoding="utf-8"))["from_cache"] is True


def test_a_training_run_starts_from_the_kept_tokens(
    tmp_path: Path, model_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = train_config(max_steps=2, eval_steps=None, save_steps=None)
    prepare_only(train_job(tmp_path, config, prepare_only=True), model_path, tmp_path)
    capsys.readouterr()
    cached, where, hit = examples(config, tokenizer, tmp_path, tmp_path / "cache" / CACHE_DIR, store=False)
    assert hit and cached == tokenized(config, tokenizer)  # the very examples tokenizing gives
    recipe.run(train_job(tmp_path, config), model_path)
    assert f"tokenized examples from {where}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "change",
    ["sequence_len", "train_on_inputs", "file", "special_tokens", "dataset_type"],
)
def test_anything_the_tokens_depend_on_is_another_key(tmp_path: Path, tokenizer: Any, change: str) -> None:
    data = tmp_path / "data.jsonl"
    shutil.copy(TINY_DATA, data)
    base = train_config(datasets=[{"path": str(data), "type": "alpaca"}])
    first = key(base, tokenizer, tmp_path)
    config, tok = base, tokenizer
    if change == "sequence_len":
        config = train_config(datasets=[{"path": str(data), "type": "alpaca"}], sequence_len=64)
    elif change == "train_on_inputs":
        config = train_config(datasets=[{"path": str(data), "type": "alpaca"}], train_on_inputs=True)
    elif change == "file":
        data.write_text(data.read_text(encoding="utf-8").replace("a", "b", 1), encoding="utf-8")
    elif change == "dataset_type":
        config = train_config(datasets=[{"path": str(data), "type": "completion", "field": "output"}])
    else:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        tok.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    assert key(config, tok, tmp_path) != first


def test_the_same_data_elsewhere_is_the_same_key(tmp_path: Path, tokenizer: Any) -> None:
    """A node unpacks the shipped files under another directory: the key reads their bytes, not their path."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(TINY_DATA, tmp_path / "a" / "d.jsonl")
    shutil.copy(TINY_DATA, tmp_path / "b" / "d.jsonl")
    one = train_config(datasets=[{"path": str(tmp_path / "a" / "d.jsonl"), "type": "alpaca"}])
    two = train_config(datasets=[{"path": str(tmp_path / "b" / "d.jsonl"), "type": "alpaca"}])
    assert key(one, tokenizer, tmp_path) == key(two, tokenizer, tmp_path)


def test_a_torn_or_stale_cache_is_not_read(tmp_path: Path, tokenizer: Any) -> None:
    config = train_config()
    root = tmp_path / "prepared"
    found, where, hit = examples(config, tokenizer, None, root, store=True)
    assert where is not None and not hit
    (where / META_FILE).unlink()  # the meta is written last: without it the examples may be half there
    assert examples(config, tokenizer, None, root, store=False)[2] is False
    (where / META_FILE).write_text(json.dumps({"format": 1, "examples": len(found) + 1}), encoding="utf-8")
    assert examples(config, tokenizer, None, root, store=False)[2] is False
    (where / META_FILE).write_text(json.dumps({"format": 1, "examples": len(found)}), encoding="utf-8")
    assert examples(config, tokenizer, None, root, store=False)[2] is True


@pytest.mark.parametrize(("log_eval", "rows"), [(None, 4), (True, 4), (False, 0)])
def test_log_eval_turns_the_builtins_eval_table_on_and_off(
    tmp_path: Path, model_path: Path, log_eval: bool | None, rows: int
) -> None:
    assert samples.table_size(4, log_eval) == rows
    config = train_config(max_steps=2, eval_steps=2, save_steps=None)
    job = train_job(tmp_path, config, log_eval=log_eval)
    recipe.run(job, model_path)
    table = Path(job.output_dir) / samples.SAMPLES_FILE
    written = table.read_text(encoding="utf-8").splitlines() if table.exists() else []
    assert len(written) == rows * 2  # two evals (at the start and at step 2), `rows` samples each


def test_debug_names_its_switches_in_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    verbosity.announce(False)
    assert capsys.readouterr().err == ""
    verbosity.announce(True)
    said = capsys.readouterr().err
    assert "debug logging on" in said and all(f"{k}={v}" in said for k, v in verbosity.DEBUG_ENV.items())
