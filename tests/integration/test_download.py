"""trainer.download against the Hub fake, through real HTTP and the real huggingface_hub client: parallel
Range requests, the weight-format skip rule, private repos, resume after an interruption, retries, hub
datasets read by load_records, and a hub base model that transformers loads."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests

from tests.factories import train_config, train_job
from tests.fakes import FakeHub
from trainer import progress
from trainer.config import DatasetConfig
from trainer.data import LOCAL_COPY, load_records, localize_datasets
from trainer.download import HubAccess, download, list_repo, model_files, snapshot
from trainer.errors import DatasetError, DownloadError, ModelUnavailable
from trainer.tiny import build_tiny, resolve_model
from trainer.transfer_state import STATE_DIR, merged, missing

pytestmark = pytest.mark.integration

TOKEN = "hf-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIB = 1024 * 1024
BIG = 20 * MIB
CONFIG = b'{"model_type": "llama", "hidden_size": 8}'


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(home=tmp_path / "hub", token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20 MiB file of random bytes, standing in for model.safetensors (written once per module)."""
    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    path.write_bytes(os.urandom(BIG))
    return path


def access(hub: FakeHub, token: str | None = TOKEN, connections: int = 8) -> HubAccess:
    return HubAccess(endpoint=hub.url, token=token, connections=connections)


def seed_model(hub: FakeHub, weights: Path, repo_id: str = "me/model", private: bool = False) -> str:
    """A model repo carrying its weights in safetensors and again in other formats; returns the commit."""
    files: dict[str, bytes | Path] = {
        "model.safetensors": weights,
        "pytorch_model.bin": os.urandom(MIB),  # the PyTorch twin
        "pytorch_model.bin.index.json": b"{}",
        "flax_model.msgpack": b"\0flax",
        "original/consolidated.00.pth": b"\0meta",
        "onnx/model.onnx": b"\0onnx",
        "config.json": CONFIG,
        "generation_config.json": b'{"do_sample": false}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "README.md": b"# model\n",
    }
    return hub.put_files(repo_id, files, private=private)


def downloads(hub: FakeHub, since: int = 0) -> list[dict[str, Any]]:
    """The fake's log of file GETs (through its HTTP control endpoint), from entry `since` on.

    The fake counts a reply's bytes when its thread has written the last one, which can be a moment after
    the client has read it: wait (briefly) until every answered GET has its count.
    """
    deadline = time.monotonic() + 2
    while True:
        log = requests.get(f"{hub.url}/_fake/state", timeout=5).json()["downloads"][since:]
        if time.monotonic() > deadline or all(d["bytes"] for d in log if d["status"] in (200, 206)):
            return list(log)
        time.sleep(0.02)


def span(range_header: str) -> tuple[int, int]:
    """'bytes=a-b' as [a, b + 1)."""
    first, last = range_header.removeprefix("bytes=").split("-")
    return int(first), int(last) + 1


def test_model_in_parallel_ranges_without_other_formats(hub: FakeHub, weights: Path, tmp_path: Path) -> None:
    sha = seed_model(hub, weights)
    hub.throttle_bps = 4e6  # per connection: one connection would need 5.2 s for the 20 MiB
    got = snapshot("me/model", tmp_path / "cache", access(hub), "model", model_files)

    assert got.path == tmp_path / "cache" / "hub" / "models--me--model" / sha
    on_disk = sorted(p.relative_to(got.path).as_posix() for p in got.path.rglob("*") if p.is_file())
    assert on_disk == [
        ".gitattributes",
        f"{STATE_DIR}/manifest.json",
        "README.md",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (got.path / "model.safetensors").read_bytes() == weights.read_bytes()
    assert (got.path / "config.json").read_bytes() == CONFIG
    log = downloads(hub)
    assert {d["path"] for d in log} == set(on_disk) - {f"{STATE_DIR}/manifest.json"}  # no .bin, no original/
    big = [d for d in log if d["path"] == "model.safetensors"]
    assert len(big) >= 8 and all(d["status"] == 206 for d in big)
    assert merged(span(d["range"]) for d in big) == [(0, BIG)]
    assert sum(d["bytes"] for d in big) == BIG  # every byte once
    stats = got.stats
    assert (stats.files, stats.unneeded, stats.bytes_skipped) == (7, 5, 0)
    assert stats.connections == 8 and stats.bytes == sum(d["bytes"] for d in log)
    assert stats.seconds < 2.6, f"8 connections took {stats.seconds:.1f} s, half of one connection's time"

    again = snapshot("me/model", tmp_path / "cache", access(hub), "model", model_files)
    assert (again.stats.bytes, again.stats.files_skipped, again.stats.bytes_skipped) == (0, 7, stats.bytes)
    assert len(downloads(hub)) == len(log)  # nothing fetched twice


def test_private_repo_needs_the_token(hub: FakeHub, tmp_path: Path) -> None:
    hub.put_files("me/secret", {"model.safetensors": b"\0weights", "config.json": CONFIG}, private=True)

    with pytest.raises(DownloadError, match=r"'me/secret'.*not found.*no HF_TOKEN was set"):
        snapshot("me/secret", tmp_path / "cache", access(hub, token=None), "model", model_files)
    with pytest.raises(DownloadError, match=r"HTTP 401 \(HF_TOKEN was set\)") as wrong:
        snapshot("me/secret", tmp_path / "cache", access(hub, token="hf-wrong"), "model", model_files)
    assert "hf-wrong" not in str(wrong.value) and "hf-wrong" not in repr(access(hub, token="hf-wrong"))
    assert downloads(hub) == []

    got = snapshot("me/secret", tmp_path / "cache", access(hub), "model", model_files)
    assert (got.path / "model.safetensors").read_bytes() == b"\0weights"


def test_a_large_file_comes_from_the_cdn_the_hub_redirects_to_without_the_token(
    hub: FakeHub, weights: Path, tmp_path: Path
) -> None:
    """The Hub answers an LFS file's /resolve with a 302 to its CDN (another origin), as huggingface.co
    does; the CDN's signed URLs refuse a request that also carries Authorization, as S3's do: the token
    must stay with the Hub. A small file is served by the Hub itself."""
    hub.put_files("me/secret", {"model.safetensors": weights, "config.json": CONFIG}, private=True)
    got = snapshot("me/secret", tmp_path / "cache", access(hub, connections=4), "model", model_files)

    assert (got.path / "model.safetensors").read_bytes() == weights.read_bytes()
    requests_seen = hub.state()["requests"]
    assert requests_seen["redirect"] == got.stats.requests - 2  # every part's GET went through the CDN...
    assert requests_seen["download"] == got.stats.requests  # ...and each was answered there, with bytes
    log = downloads(hub)
    big = [d for d in log if d["path"] == "model.safetensors"]
    assert all(d["status"] == 206 for d in big) and sum(d["bytes"] for d in big) == BIG
    assert hub.cdn is not None and hub.cdn.url != hub.url  # another origin: the client dropped the token

    # What the CDN answers a client that forwards the token, or a URL that is not its own.
    redirect = requests.get(
        f"{hub.url}/me/secret/resolve/main/model.safetensors", headers=AUTH, allow_redirects=False
    )
    assert redirect.status_code == 302 and redirect.headers["X-Linked-Size"] == str(BIG)
    location = redirect.headers["Location"]
    assert location.startswith(hub.cdn.url)
    assert requests.get(location, headers={**AUTH, "Range": "bytes=0-9"}).status_code == 400
    assert (
        requests.get(
            location.replace("Signature=", "Signature=0"), headers={"Range": "bytes=0-9"}
        ).status_code
        == 403
    )
    assert requests.get(location, headers={"Range": "bytes=0-9"}).content == weights.read_bytes()[:10]


def test_an_interrupted_download_fetches_only_the_missing_bytes(
    hub: FakeHub, weights: Path, tmp_path: Path
) -> None:
    hub.put_files("me/model", {"model.safetensors": weights, "config.json": CONFIG})
    listing = list_repo("me/model", access(hub))
    dest = tmp_path / "model"
    # The first part to be served drops its connection after 512 KiB; with no retries the run stops.
    hub.add_faults([{"op": "download", "kind": "disconnect", "after_bytes": 512 * 1024}])
    with pytest.raises(DownloadError, match=r"model.safetensors: bytes .*attempt 1 of 1: giving up"):
        download(listing, listing.files, dest, access(hub, connections=4), part_size=2 * MIB, retries=0)

    sidecar = dest / STATE_DIR / "progress" / "model.safetensors.json"
    kept = [tuple(s) for s in json.loads(sidecar.read_text())["done"]]
    kept_bytes = sum(b - a for a, b in kept)
    assert not (dest / "model.safetensors").exists() and 512 * 1024 <= kept_bytes < BIG
    assert any(end % (2 * MIB) for _, end in kept), "the cut part's first 512 KiB are kept too"
    before = len(downloads(hub))

    stats = download(listing, listing.files, dest, access(hub, connections=4), part_size=2 * MIB)
    assert (dest / "model.safetensors").read_bytes() == weights.read_bytes()
    second = [d for d in downloads(hub, before) if d["path"] == "model.safetensors"]
    assert merged(span(d["range"]) for d in second) == missing(kept, BIG)  # exactly the gaps, once
    assert sum(d["bytes"] for d in second) == BIG - kept_bytes
    assert stats.bytes_skipped >= kept_bytes and not sidecar.exists()


def test_dropped_parts_and_throttling_are_retried(hub: FakeHub, weights: Path, tmp_path: Path) -> None:
    hub.put_files("me/model", {"model.safetensors": weights})
    listing = list_repo("me/model", access(hub))
    hub.add_faults(
        [
            {"op": "download", "kind": "disconnect", "after_bytes": 300_000},
            {"op": "download", "kind": "429", "retry_after": 0},
        ]
    )
    stats = download(listing, listing.files, tmp_path / "m", access(hub, connections=1), part_size=4 * MIB)

    assert (tmp_path / "m" / "model.safetensors").read_bytes() == weights.read_bytes()
    assert stats.retries == 2 and stats.bytes == sum(f.size for f in listing.files)
    first, resumed = downloads(hub)[:2]  # the fake logs served GETs; the 429 only in its request count
    assert (first["range"], first["bytes"]) == (f"bytes=0-{4 * MIB - 1}", 300_000)
    assert resumed["range"] == f"bytes=300000-{4 * MIB - 1}"  # the retry picks up where the drop left off
    assert hub.state()["requests"]["download"] == stats.requests == 6 + 2  # 5 parts, .gitattributes, retries


def test_hub_dataset_files_load_as_records(hub: FakeHub, tmp_path: Path) -> None:
    rows = [{"text": f"train row {i}"} for i in range(3)]
    hub.put_files(
        "me/corpus",
        {
            "data/train-00000-of-00001.jsonl": "".join(json.dumps(r) + "\n" for r in rows).encode(),
            "data/test-00000-of-00001.jsonl": b'{"text": "held out"}\n',
            "extra.jsonl": b'{"text": "extra"}\n',
            "README.md": b"# corpus\n",
        },
        repo_type="dataset",
    )
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist([{"text": "a parquet row"}]), sink)
    hub.put_files(
        "me/tables",
        {"data/train.parquet": sink.getvalue().to_pybytes(), "README.md": b"#"},
        repo_type="dataset",
    )
    hub.put_files("me/notes", {"notes.txt": b"plain", "README.md": b"#"}, repo_type="dataset")
    entry = DatasetConfig(path="me/corpus", type="completion")
    cache = tmp_path / "cache"

    local, stats = localize_datasets([entry], tmp_path, cache, access(hub))
    assert [r.completion for r in load_records(local, tmp_path)] == [r["text"] for r in rows]
    assert local[0].path == "me/corpus" and local[0].data_files == ["data/train-00000-of-00001.jsonl"]
    assert Path((local[0].model_extra or {})[LOCAL_COPY]).parent == cache / "hub" / "datasets--me--corpus"
    assert stats[0].files == 1 and [d["path"] for d in downloads(hub)] == ["data/train-00000-of-00001.jsonl"]

    picked = entry.model_copy(update={"data_files": ["extra.jsonl"], "split": "ignored"})
    assert [
        r.completion for r in load_records(localize_datasets([picked], tmp_path, cache, access(hub))[0])
    ] == ["extra"]
    tables = localize_datasets(
        [DatasetConfig(path="me/tables", type="completion")], tmp_path, cache, access(hub)
    )
    assert [r.completion for r in load_records(tables[0])] == ["a parquet row"]  # parquet, when no JSONL
    with pytest.raises(
        DatasetError, match=r"'me/notes' has no .jsonl, .parquet, .json, .csv or .arrow files"
    ):
        localize_datasets([DatasetConfig(path="me/notes")], tmp_path, cache, access(hub))
    with pytest.raises(DatasetError, match=r"'me/nothing' is not a local path; from the hub: .*not found"):
        localize_datasets([DatasetConfig(path="me/nothing")], tmp_path, cache, access(hub))
    assert [d["path"] for d in downloads(hub)] == [
        "data/train-00000-of-00001.jsonl",
        "extra.jsonl",
        "data/train.parquet",
    ]


def test_hub_base_model_resolves_loads_and_reports_its_download(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.train import fetch

    tiny = build_tiny(tmp_path / "build")
    sha = hub.put_files("me/tiny-llama", {p.name: p for p in tiny.iterdir() if p.is_file()})
    hub.put_files(
        "me/alpaca", {"train.jsonl": b'{"instruction": "Say hi.", "output": "hi"}\n'}, repo_type="dataset"
    )
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    cache = tmp_path / "cache"

    path = resolve_model("me/tiny-llama", cache)
    assert path == cache / "hub" / "models--me--tiny-llama" / sha
    loaded, built = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (path, tiny))
    assert loaded.keys() == built.keys() and all(loaded[k].equal(built[k]) for k in built)
    assert (
        AutoTokenizer.from_pretrained(path)("hello")["input_ids"]
        == AutoTokenizer.from_pretrained(tiny)("hello")["input_ids"]
    )

    job = train_job(tmp_path, train_config(base_model="me/tiny-llama", datasets=[{"path": "me/alpaca"}]))
    fetched = fetch(job, tmp_path)
    (record,) = progress.parse(capsys.readouterr().out)
    assert record["model_path"] == str(path) and record["examples"] == 1
    figures = record["download"]
    assert fetched.download is not None and figures == fetched.download.model_dump()
    assert figures["files"] == 1  # the model was there already
    assert figures["bytes"] == len(b'{"instruction": "Say hi.", "output": "hi"}\n')
    assert figures["bytes_skipped"] == sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    assert figures["connections"] == 1 and figures["seconds"] > 0 and "mb_per_s" in figures
    assert [r["repo_id"] for r in figures["repos"]] == ["me/tiny-llama", "me/alpaca"]

    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ModelUnavailable, match=r"'me/gone'.*not found.*no HF_TOKEN was set"):
        resolve_model("me/gone", cache)
