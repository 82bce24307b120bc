"""The Hub fake, driven by the real huggingface_hub client (in process with `endpoint=`, and by the `hf` CLI
through HF_ENDPOINT against `python -m tests.fakes serve hub`)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

from tests.fakes import FakeHub

pytestmark = pytest.mark.integration

TOKEN = "hf-test-token"
MIB = 1024 * 1024
BIG = 11 * MIB  # above the Hub's 10 MiB LFS threshold; also one client read chunk (10 MiB) and then some


@pytest.fixture(autouse=True)
def no_xet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake speaks plain HTTP and LFS only (HF_HUB_DISABLE_XET is read when the client is imported)."""
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(home=tmp_path / "hub", token=TOKEN, user="me") as server:
        yield server


@pytest.fixture
def api(hub: FakeHub) -> HfApi:
    return HfApi(endpoint=hub.url, token=TOKEN)


def download(hub: FakeHub, repo_id: str, dest: Path, **kwargs: Any) -> Path:
    """snapshot_download into `dest` (its cache under dest's parent), with the token unless told otherwise."""
    kwargs.setdefault("token", TOKEN)
    cache = dest.parent / "cache"
    return Path(snapshot_download(repo_id, local_dir=dest, cache_dir=cache, endpoint=hub.url, **kwargs))


def fetch(hub: FakeHub, repo_id: str, filename: str, dest: Path, **kwargs: Any) -> Path:
    """hf_hub_download into `dest` (its cache under dest's parent), with the token unless told otherwise."""
    kwargs.setdefault("token", TOKEN)
    cache = dest.parent / "cache"
    return Path(
        hf_hub_download(repo_id, filename, local_dir=dest, cache_dir=cache, endpoint=hub.url, **kwargs)
    )


def files_under(root: Path) -> dict[str, bytes]:
    """Relative path -> content of every file, leaving out the client's .cache folder."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    }


def test_upload_folder_lfs_and_download_round_trip(hub: FakeHub, api: HfApi, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"hidden_size": 8}')
    (src / "sub" / "notes.txt").write_text("hello")
    (src / "model.safetensors").write_bytes(os.urandom(BIG))

    url = api.create_repo("me/tiny", private=True, exist_ok=True)
    assert (url.repo_id, url.repo_type) == ("me/tiny", "model")
    assert api.create_repo("me/tiny", private=True, exist_ok=True).repo_id == "me/tiny"  # 409 -> exist_ok
    first = api.upload_folder(repo_id="me/tiny", folder_path=src, commit_message="first upload")

    expected = [".gitattributes", "config.json", "model.safetensors", "sub/notes.txt"]
    assert re.fullmatch(r"[0-9a-f]{40}", first.oid)
    assert sorted(api.list_repo_files("me/tiny")) == expected
    assert api.model_info("me/tiny").sha == first.oid
    assert api.file_exists("me/tiny", "sub/notes.txt") and not api.file_exists("me/tiny", "missing.txt")

    got = files_under(download(hub, "me/tiny", tmp_path / "out", max_workers=4))
    assert {k: v for k, v in got.items() if k != ".gitattributes"} == files_under(src)

    (src / "config.json").write_text('{"hidden_size": 16}')
    second = api.upload_folder(repo_id="me/tiny", folder_path=src, commit_message="second upload")
    assert second.oid != first.oid and api.model_info("me/tiny").sha == second.oid

    state = requests.get(f"{hub.url}/_fake/state", timeout=5).json()
    (repo,) = state["repos"]
    assert (repo["id"], repo["type"], repo["private"], repo["head"]) == ("me/tiny", "model", True, second.oid)
    assert [c["message"] for c in repo["commits"]] == ["initial commit", "first upload", "second upload"]
    rows = {f["path"]: f for f in repo["files"]}
    assert rows["model.safetensors"]["lfs"] and rows["model.safetensors"]["size"] == BIG
    assert not rows["config.json"]["lfs"] and rows["config.json"]["size"] == len('{"hidden_size": 16}')
    # The big file went through the LFS batch API once; the second commit found it already stored.
    requests_made = state["requests"]
    assert requests_made["lfs_upload"] == 1 and requests_made["lfs_verify"] == 1
    assert requests_made["commit"] == 2 and requests_made["preupload"] == 2


def test_allow_and_ignore_patterns(hub: FakeHub, tmp_path: Path) -> None:
    weights = tmp_path / "weights.bin"
    weights.write_bytes(os.urandom(1000))
    files: dict[str, bytes | Path] = {
        "config.json": b"{}",
        "model.bin": weights,  # seeded from a file on disk, as a benchmark's big model would be
        "data/a.txt": b"a",
        "data/b.bin": b"\0b",
    }
    hub.put_files("me/patterns", files)
    everything = files_under(download(hub, "me/patterns", tmp_path / "all"))
    assert everything["model.bin"] == weights.read_bytes() and len(everything) == 5
    fetched_before = len(hub.state()["downloads"])

    no_bin = files_under(download(hub, "me/patterns", tmp_path / "no-bin", ignore_patterns=["*.bin"]))
    assert sorted(no_bin) == [".gitattributes", "config.json", "data/a.txt"]

    some = download(hub, "me/patterns", tmp_path / "some", allow_patterns=["data/*"], ignore_patterns="*.bin")
    assert files_under(some) == {"data/a.txt": b"a"}
    fetched = [d["path"] for d in hub.state()["downloads"][fetched_before:]]
    assert sorted(fetched) == [".gitattributes", "config.json", "data/a.txt", "data/a.txt"]


def test_private_repo_is_not_found_without_token(hub: FakeHub, api: HfApi, tmp_path: Path) -> None:
    hub.put_files("me/secret", {"config.json": b"{}"}, private=True)
    anonymous = HfApi(endpoint=hub.url, token=False)

    with pytest.raises(RepositoryNotFoundError):
        anonymous.model_info("me/secret")
    with pytest.raises(RepositoryNotFoundError):
        download(hub, "me/secret", tmp_path / "anon", token=False)
    with pytest.raises(RepositoryNotFoundError):
        fetch(hub, "me/secret", "config.json", tmp_path / "one", token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("me/missing")  # authenticated, and still not there: 404
    with pytest.raises(HfHubHTTPError) as bad_token:
        HfApi(endpoint=hub.url, token="hf-wrong").model_info("me/secret")
    assert bad_token.value.response.status_code == 401
    assert not isinstance(bad_token.value, RepositoryNotFoundError)
    with pytest.raises(HfHubHTTPError):
        anonymous.create_repo("me/other")
    assert api.whoami()["name"] == "me"

    assert files_under(download(hub, "me/secret", tmp_path / "ok"))["config.json"] == b"{}"


def test_dataset_repos_are_separate_from_models(hub: FakeHub, api: HfApi, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text('{"text": "hi"}\n')
    api.create_repo("me/corpus", repo_type="dataset", exist_ok=True)
    api.upload_folder(repo_id="me/corpus", repo_type="dataset", folder_path=src, commit_message="data")

    path = fetch(hub, "me/corpus", "train.jsonl", tmp_path / "d", token=False, repo_type="dataset")
    assert path.read_text() == '{"text": "hi"}\n'
    assert api.dataset_info("me/corpus").sha == hub.state()["repos"][0]["head"]
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("me/corpus")


def test_download_resumes_with_range_after_a_dropped_connection(hub: FakeHub, tmp_path: Path) -> None:
    content = os.urandom(BIG + MIB)
    hub.put_files("me/resume", {"model.safetensors": content})
    requests.post(
        f"{hub.url}/_fake/faults",
        json=[{"op": "download", "kind": "disconnect", "after_bytes": BIG}],
        timeout=5,
    ).raise_for_status()

    assert fetch(hub, "me/resume", "model.safetensors", tmp_path / "d").read_bytes() == content

    # The client keeps what it had read (one 10 MiB chunk), then asks for the rest only.
    first, second = hub.state()["downloads"]
    assert (first["range"], first["status"], first["bytes"]) == (None, 200, BIG)
    assert (second["range"], second["status"]) == (f"bytes={10 * MIB}-", 206)
    assert second["bytes"] == len(content) - 10 * MIB


def test_throttle_caps_each_connection_not_the_server(tmp_path: Path) -> None:
    rate, size = 2_000_000, 4_000_000
    with FakeHub(home=tmp_path / "hub", token=TOKEN, throttle_bps=rate) as hub:
        hub.put_files("me/shards", {f"shard-{i}.bin": os.urandom(size) for i in range(4)})

        started = time.monotonic()
        fetch(hub, "me/shards", "shard-0.bin", tmp_path / "one")
        one = time.monotonic() - started

        started = time.monotonic()
        got = download(hub, "me/shards", tmp_path / "four", allow_patterns="shard-*", max_workers=4)
        four = time.monotonic() - started

    assert len(files_under(got)) == 4
    assert 1.6 < one < 3.5, f"one 4 MB file at 2 MB/s took {one:.2f}s"
    assert 1.6 < four < 3.5, f"four 4 MB files on four connections took {four:.2f}s"


def test_link_caps_all_connections_together(tmp_path: Path) -> None:
    """Under a link of 2 MB/s, four 1 MB files on four connections come at 2 MB/s in all (about 2 s, as
    one connection would take), not 2 MB/s each (0.5 s); each connection alone is not capped."""
    link, size = 2_000_000, 1_000_000
    with FakeHub(home=tmp_path / "hub", token=TOKEN, link_bps=link) as hub:
        hub.put_files("me/shards", {f"shard-{i}.bin": os.urandom(size) for i in range(4)})
        assert hub.state()["link_bps"] == link

        started = time.monotonic()
        got = download(hub, "me/shards", tmp_path / "four", allow_patterns="shard-*", max_workers=4)
        four = time.monotonic() - started
        sent = sum(d["bytes"] for d in hub.state()["downloads"])

    assert len(files_under(got)) == 4 and sent == 4 * size
    # Never faster than the link (10% for the bucket's burst and clock grain); a busy machine only slows it.
    assert sent / four <= 1.1 * link, f"4 MB on four connections came at {sent / four / 1e6:.2f} MB/s"
    assert four < 10, f"4 MB under a 2 MB/s link took {four:.2f}s"


def test_scripted_500_and_429(hub: FakeHub, api: HfApi, tmp_path: Path) -> None:
    hub.put_files("me/flaky", {"config.json": b"{}"})
    hub.add_faults([{"op": "repo_info", "kind": "500"}, {"op": "download", "kind": "429", "retry_after": 0}])

    with pytest.raises(HfHubHTTPError) as error:
        api.model_info("me/flaky")
    assert error.value.response.status_code == 500
    assert api.model_info("me/flaky").id == "me/flaky"

    assert fetch(hub, "me/flaky", "config.json", tmp_path / "d").read_bytes() == b"{}"
    assert hub.state()["requests"]["download"] == 2  # the client retried the 429 once


def test_command_line_serves_the_hf_cli(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes", "serve", "hub", "--port", "0", "--home", str(tmp_path / "hub")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        whoami = requests.get(f"{url}/api/whoami-v2", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert whoami.json()["name"] == "tester"

        src = tmp_path / "src"
        src.mkdir()
        (src / "weights.bin").write_bytes(os.urandom(100_000))
        env = {
            **os.environ,
            "HF_ENDPOINT": url,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
        hf = str(Path(sys.executable).parent / "hf")
        upload = [hf, "upload", "tester/cli", str(src), ".", "--private"]  # the served fake's user
        subprocess.run(upload, env=env, check=True, timeout=60)
        out = tmp_path / "out"
        download_cmd = [hf, "download", "tester/cli", "--local-dir", str(out)]
        subprocess.run(download_cmd, env=env, check=True, timeout=60)
        assert (out / "weights.bin").read_bytes() == (src / "weights.bin").read_bytes()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "stopped" in err


def test_a_token_writes_only_where_the_hub_lets_it(hub: FakeHub, api: HfApi, tmp_path: Path) -> None:
    """Read tokens read; a write token writes to its user's namespace and orgs'; a fine-grained one to the
    namespaces it names. Anything else is 403 with the Hub's reason, which huggingface_hub shows."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    api.create_repo("me/mine", exist_ok=True)
    hub.put_files("someone/theirs", {"a.txt": b"a"})
    hub.add_token("hf-read", role="read")
    hub.add_token("hf-scoped", namespaces=["team"])
    reader, scoped = HfApi(endpoint=hub.url, token="hf-read"), HfApi(endpoint=hub.url, token="hf-scoped")

    assert reader.model_info("me/mine").id == "me/mine"  # reading is what a read token is for
    with pytest.raises(HfHubHTTPError, match="read token") as read_only:
        reader.upload_folder(repo_id="me/mine", folder_path=src)
    assert read_only.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError, match='under the namespace "someone"') as foreign:
        api.upload_folder(repo_id="someone/theirs", folder_path=src)
    assert foreign.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError, match='create a model under the namespace "someone"'):
        api.create_repo("someone/new")
    with pytest.raises(HfHubHTTPError, match='under the namespace "me"'):
        scoped.create_repo("me/other")
    assert scoped.create_repo("team/shared").repo_id == "team/shared"
    assert reader.whoami()["auth"]["accessToken"]["role"] == "read"
    assert scoped.whoami()["auth"]["accessToken"]["role"] == "fineGrained"
    assert [r["id"] for r in hub.state()["repos"]] == ["me/mine", "someone/theirs", "team/shared"]
