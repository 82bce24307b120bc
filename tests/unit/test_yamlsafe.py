"""jobs.yamlsafe: plain data with key lines, or a ConfigError naming the problem and its line."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from core.errors import ConfigError, Problem
from jobs.yamlsafe import MAX_BYTES, MAX_DEPTH, join_path, load_yaml


def refused(text: str | bytes) -> list[Problem]:
    data = text.encode() if isinstance(text, str) else text
    with pytest.raises(ConfigError) as info:
        load_yaml(data, source="job.yml")
    assert info.value.source == "job.yml"
    return info.value.problems


def only(problems: list[Problem]) -> Problem:
    assert len(problems) == 1, problems
    return problems[0]


def test_data_and_the_line_of_every_key_path() -> None:
    text = b"base_model: m\ndatasets:\n  - path: a.jsonl\n    type: alpaca\n  - path: b\n"
    text += b"runpod:\n  gpu_count: 2\n"
    doc = load_yaml(text, source="job.yml")
    assert doc.data == {
        "base_model": "m",
        "datasets": [{"path": "a.jsonl", "type": "alpaca"}, {"path": "b"}],
        "runpod": {"gpu_count": 2},
    }
    assert doc.lines["base_model"] == 1
    assert doc.lines["datasets[0]"] == 3
    assert doc.lines["datasets[0].type"] == 4
    assert doc.lines["datasets[1].path"] == 5
    assert doc.lines["runpod.gpu_count"] == 7
    assert doc.text.startswith("base_model: m\n")


def test_keys_are_their_text_and_dates_stay_strings() -> None:
    doc = load_yaml(b"1: a\nyes: b\nwhen: 2023-06-01\nflag: yes\nnone: ~\nx: 1.5\n", source="job.yml")
    assert doc.data == {"1": "a", "yes": "b", "when": "2023-06-01", "flag": True, "none": None, "x": 1.5}


def test_join_path() -> None:
    assert join_path("", "a") == "a"
    assert join_path("a", "b") == "a.b"
    assert join_path("datasets", 0) == "datasets[0]"


def test_an_unused_anchor_is_harmless() -> None:
    assert load_yaml(b"a: &x 1\n", source="job.yml").data == {"a": 1}


def test_a_single_alias_is_refused_with_its_line() -> None:
    problem = only(refused("a: &x 1\nb: 2\nc: *x\n"))
    assert problem.line == 3
    assert "aliases are not allowed (*x)" in problem.message


def test_billion_laughs_is_refused_fast_and_small() -> None:
    levels = ["a0: &a0 [" + ", ".join(['"lol"'] * 9) + "]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    data = ("\n".join(levels) + "\n").encode()
    tracemalloc.start()
    started = time.perf_counter()
    problem = only(refused(data))
    elapsed = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert "aliases are not allowed" in problem.message
    assert elapsed < 1.0
    assert peak < 50 * 1024 * 1024


@pytest.mark.parametrize(
    ("text", "path", "line", "tag"),
    [
        ("a: 1\nb: !!python/object/apply:os.system ['ls']\n", "b", 2, "!!python/object/apply:os.system"),
        ("a: !!python/name:os.system\n", "a", 1, "!!python/name:os.system"),
        ("a:\n  b: !custom x\n", "a.b", 2, "!custom"),
        ("a: !!binary aGVsbG8=\n", "a", 1, "!!binary"),
        ("a: !!timestamp 2023-01-01\n", "a", 1, "!!timestamp"),
        ("a: !!set {x: null}\n", "a", 1, "!!set"),
        ("a: !!omap [x: 1]\n", "a", 1, "!!omap"),
        ("!!python/str k: 1\n", "k", 1, "!!python/str"),
    ],
)
def test_tags_other_than_the_core_ones_are_refused(text: str, path: str, line: int, tag: str) -> None:
    problem = only(refused(text))
    assert (problem.path, problem.line) == (path, line)
    assert f"tag {tag} is not allowed" in problem.message


def test_explicit_core_tags_are_fine() -> None:
    doc = load_yaml(b"a: !!str 123\nb: !!int 7\nc: !!float 1\nd: ! plain\n", source="job.yml")
    assert doc.data == {"a": "123", "b": 7, "c": 1.0, "d": "plain"}


@pytest.mark.parametrize("text", ["a: !!int abc\n", "a: !!bool maybe\n", "a: !!float x\n", "a: !!int ''\n"])
def test_a_core_tag_on_a_value_it_cannot_read(text: str) -> None:
    problem = only(refused(text))
    assert (problem.path, problem.line) == ("a", 1)
    assert "is not a valid !!" in problem.message


def test_duplicate_keys_at_every_level_name_both_lines() -> None:
    problems = refused("a: 1\nb:\n  c: 1\n  d: [{e: 1, e: 2}]\n  c: 2\na: 3\n")
    assert [(p.path, p.line) for p in problems] == [("b.d[0].e", 4), ("b.c", 5), ("a", 6)]
    assert problems[1].message == "duplicate key 'c' (first at line 3, again at line 5)"
    assert problems[2].message == "duplicate key 'a' (first at line 1, again at line 6)"


def test_keys_equal_after_quoting_are_duplicates() -> None:
    assert "duplicate key 'a'" in only(refused("a: 1\n'a': 2\n")).message


def test_merge_keys_are_refused() -> None:
    problem = only(refused("a: 1\n<<: {b: 2}\n"))
    assert (problem.path, problem.line) == ("<<", 2)
    assert "merge keys" in problem.message


def test_a_quoted_double_angle_key_is_just_a_key() -> None:
    assert load_yaml(b"'<<': 1\n", source="job.yml").data == {"<<": 1}


def test_complex_keys_are_refused() -> None:
    assert "keys must be plain names" in only(refused("? [a, b]\n: 1\n")).message


def test_size_is_checked_before_parsing() -> None:
    # Invalid YAML throughout: if it were parsed, the error would be a syntax error, not the size.
    data = b"[" * (MAX_BYTES + 1)
    problem = only(refused(data))
    assert problem.message == f"file is {MAX_BYTES + 1} bytes; the limit is {MAX_BYTES} bytes"
    assert "limit" in only(refused(b"a: 1\n" * (1024 * 1024 // 5 + 1))).message


def test_a_file_of_exactly_the_limit_is_parsed() -> None:
    data = b"a: '" + b"x" * (MAX_BYTES - 6) + b"'\n"
    assert len(data) == MAX_BYTES
    assert len(load_yaml(data, source="job.yml").data["a"]) == MAX_BYTES - 6


def test_non_utf8_bytes_name_the_line() -> None:
    problem = only(refused(b"a: 1\nb: caf\xe9\n"))
    assert problem.line == 2
    assert problem.message == "the file must be UTF-8 text (byte 0xe9 is not valid UTF-8)"


def test_utf16_is_refused() -> None:
    assert "UTF-8" in only(refused("a: 1\n".encode("utf-16"))).message


def test_control_characters_are_refused() -> None:
    problem = only(refused(b"a: 1\nb: x\x00y\n"))
    assert problem.line == 2
    assert "#x0000 is not allowed" in problem.message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("- a\n- b\n", "not a list"),
        ("just text\n", "not a single value"),
    ],
)
def test_the_top_level_must_be_a_mapping(text: str, message: str) -> None:
    assert message in only(refused(text)).message


@pytest.mark.parametrize(
    ("text", "line"),
    [("a: 1\nb: [1, 2\nc: 3\n", 3), ("a: 1\n  b: 2\n", 2), ("a: 'open\n", 2), ("a: 1\n---\nb: 2\n", 2)],
)
def test_syntax_errors_carry_a_line(text: str, line: int) -> None:
    problem = only(refused(text))
    assert problem.message.startswith("YAML syntax error: ")
    assert problem.line == line


def test_deep_nesting_is_refused() -> None:
    ok = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    load_yaml(ok.encode(), source="job.yml")
    deep = "a: " + "[" * 100_000
    assert f"deeper than {MAX_DEPTH}" in only(refused(deep)).message


def test_several_problems_are_reported_together() -> None:
    problems = refused("a: 1\na: 2\nb: !x 1\n")
    assert [p.line for p in problems] == [2, 3]
