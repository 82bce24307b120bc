"""trainer.tiny: the built-in model is deterministic, cached and safe to build concurrently; resolve_model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.factories import REPO_ROOT, TINY_DATA
from trainer.assets import make_tiny_data
from trainer.errors import ModelUnavailable
from trainer.tiny import CORPUS, TINY_NAME, TinySpec, build_tiny, recipe_hash, resolve_model

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def test_builds_are_byte_identical_in_fresh_dirs(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(1)  # the caller's RNG state must not matter...
    first = build_tiny(tmp_path / "a")
    torch.manual_seed(2)
    state = torch.random.get_rng_state()
    second = build_tiny(tmp_path / "b")
    assert torch.equal(torch.random.get_rng_state(), state)  # ...nor be changed
    assert first.relative_to(tmp_path / "a") == second.relative_to(tmp_path / "b")
    for name in FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_layout_and_reuse(tmp_path: Path) -> None:
    built = build_tiny(tmp_path)
    assert built == tmp_path / "trainfleet--tiny-llama" / recipe_hash()
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert build_tiny(tmp_path) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert [p.name for p in built.parent.iterdir() if not p.name.endswith(".lock")] == [built.name]


def test_concurrent_builders_share_one_build(tmp_path: Path) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(build_tiny, tmp_path) for _ in range(3)]
        results = {f.result() for f in futures}  # re-raises a builder's error
    assert len(results) == 1
    leftovers = [p.name for p in results.pop().parent.iterdir() if ".building-" in p.name]
    assert leftovers == []


def test_recipe_hash_follows_the_spec() -> None:
    assert recipe_hash(TinySpec(seed=1)) != recipe_hash()
    assert recipe_hash(TinySpec()) == recipe_hash()


def test_tokenizer_special_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny(tmp_path))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    ids = tok("The capital of France is Paris.")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == "The capital of France is Paris."
    assert 1000 < len(tok) <= TinySpec().vocab_size


def test_resolve_builtin_and_local(tmp_path: Path) -> None:
    built = resolve_model(TINY_NAME, tmp_path / "cache")
    assert built == build_tiny(tmp_path / "cache")
    assert resolve_model(str(built), tmp_path / "elsewhere") == built
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("name", ["no-such-model", "/no/such/model/dir"])
def test_resolve_refuses_what_is_neither_local_nor_a_hub_id(tmp_path: Path, name: str) -> None:
    # Hub ids are downloaded: tests/integration/test_download.py, against the Hub fake.
    with pytest.raises(ModelUnavailable, match="not a local directory, and not a hub id"):
        resolve_model(name, tmp_path)
    assert not any(tmp_path.iterdir())


def test_resolve_refuses_a_file(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="is a file"):
        resolve_model(str(TINY_DATA), tmp_path)


def test_committed_data_is_what_the_generator_makes(tmp_path: Path) -> None:
    written = make_tiny_data.write(tmp_path)
    assert [p.relative_to(tmp_path) for p in written] == [
        TINY_DATA.relative_to(REPO_ROOT),
        CORPUS.relative_to(REPO_ROOT),
    ]
    for path in written:
        assert path.read_bytes() == (REPO_ROOT / path.relative_to(tmp_path)).read_bytes(), path.name
