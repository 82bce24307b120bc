"""Pre-download a hub repo (a base model, or a dataset) onto the node, before the GPUs are busy.

The repo is listed at one commit (huggingface_hub's `repo_info` with sizes and digests); the files needed
are fetched by `trainer.transfer` on many connections at once, large files in byte ranges, resumable, and
verified. URLs come from `hf_hub_url` at that commit sha, so a repo that changes meanwhile cannot mix two
revisions. huggingface_hub's own `snapshot_download` fetches each file on one connection (its fast path is
hf_xet, which only Xet storage speaks), so one big safetensors file would be bound to one connection.

What a model does not need (`model_files`). Repos often carry the same weights several times. When the
repo has safetensors weights, these are left out:
- other weight formats: *.bin, *.pt, *.pth, *.ckpt (PyTorch pickles), *.msgpack (Flax), *.h5 (Keras),
  *.ot (rust-bert), *.onnx, *.onnx_data, *.tflite, *.gguf, *.ggml (llama.cpp), and their index files
  (pytorch_model.bin.index.json, ...);
- folders for other runtimes: original/ (Meta's reference checkpoints), onnx/, openvino/, coreml/,
  tflite/, gguf/;
- consolidated*.safetensors (Mistral's copy for mistral-inference) when transformers' model*.safetensors
  are there too.
Without safetensors, PyTorch weights (.bin, .pt, .pth) are kept and every other format is left out in the
same way. A repo with neither is refused before any byte is fetched: transformers could not load it.
Everything else (config.json, generation_config.json, tokenizer files, README.md, ...) is kept.

Layout: ``<cache_dir>/hub/<models|datasets>--<org>--<name>/<commit sha>/`` mirrors the repo, so a new
commit lands in a new directory; processes on one node take turns on a repo through a file lock.
`HubAccess.from_env` reads the settings when a caller asks: HF_ENDPOINT (default https://huggingface.co),
HF_TOKEN, and FLEET_HUB_CONNECTIONS (default 16). The token goes out as ``Authorization: Bearer``
and is never printed: errors say only whether one was set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from trainer.errors import DownloadError
from trainer.fslock import exclusive
from trainer.lines import Download, Repo
from trainer.transfer import DEFAULT_RETRIES, transfer
from trainer.transfer_state import Item

ENDPOINT = "https://huggingface.co"
DEFAULT_CONNECTIONS = 16
CONNECTIONS_VAR = "FLEET_HUB_CONNECTIONS"
LIST_ATTEMPTS = 3

SAFETENSORS = ".safetensors"
PYTORCH = frozenset({".bin", ".pt", ".pth"})
OTHER_WEIGHTS = (".ckpt", ".msgpack", ".h5", ".ot", ".onnx", ".onnx_data", ".tflite", ".gguf", ".ggml")
WEIGHT_SUFFIXES = (SAFETENSORS, *sorted(PYTORCH), *OTHER_WEIGHTS)
RUNTIME_FOLDERS = frozenset({"original", "onnx", "openvino", "coreml", "tflite", "gguf"})


@dataclass(frozen=True)
class HubAccess:
    """Where the hub is, the token to show it (kept out of repr), and how many connections to open."""

    endpoint: str = ENDPOINT
    token: str | None = field(default=None, repr=False)
    connections: int = DEFAULT_CONNECTIONS

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> HubAccess:
        """HF_ENDPOINT, HF_TOKEN and FLEET_HUB_CONNECTIONS from `environ` (usually os.environ)."""
        raw = environ.get(CONNECTIONS_VAR) or str(DEFAULT_CONNECTIONS)
        if not raw.isdigit() or int(raw) < 1:
            raise DownloadError(
                f"{CONNECTIONS_VAR}={raw!r}: expected a whole number of connections, 1 or more"
            )
        endpoint = (environ.get("HF_ENDPOINT") or ENDPOINT).rstrip("/")
        return cls(endpoint=endpoint, token=environ.get("HF_TOKEN") or None, connections=int(raw))

    @property
    def token_note(self) -> str:
        """Whether a token was sent, for error messages (never the token)."""
        return "HF_TOKEN was set" if self.token else "no HF_TOKEN was set"


@dataclass(frozen=True)
class RemoteFile:
    """One file of a repo at a commit: its size, and the digest that checks it."""

    path: str
    size: int
    sha256: str | None = None  # LFS (and Xet) files
    git_oid: str | None = None  # other files: the git blob id


@dataclass(frozen=True)
class Listing:
    """A repo's files at one commit."""

    repo_id: str
    repo_type: str
    sha: str
    files: tuple[RemoteFile, ...]


@dataclass(frozen=True)
class DownloadStats:
    """What fetching one repo did. `bytes`/`files`: fetched now; `*_skipped`: already on disk;
    `unneeded`: files of the repo left out (other weight formats, other datasets' files)."""

    repo_id: str
    repo_type: str
    sha: str
    bytes: int
    files: int
    bytes_skipped: int
    files_skipped: int
    unneeded: int
    seconds: float
    connections: int
    requests: int
    retries: int

    @property
    def mb_per_s(self) -> float:
        """Decimal megabytes per second over the whole call (listing and checks included)."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Snapshot:
    """A repo fetched into the cache: its directory, the files it holds for the caller, and the figures."""

    path: Path
    files: tuple[RemoteFile, ...]
    stats: DownloadStats


Select = Callable[[Listing], Sequence[RemoteFile]]


def summary(stats: Sequence[DownloadStats]) -> Download:
    """The figures of several repos fetched one after the other, for the FETCHED progress line."""
    fetched, seconds = sum(s.bytes for s in stats), sum(s.seconds for s in stats)
    return Download(
        bytes=fetched,
        files=sum(s.files for s in stats),
        seconds=round(seconds, 3),
        mb_per_s=round(fetched / seconds / 1e6, 2) if seconds > 0 else 0.0,
        connections=max((s.connections for s in stats), default=0),
        bytes_skipped=sum(s.bytes_skipped for s in stats),
        repos=[Repo(repo_id=s.repo_id, type=s.repo_type, sha=s.sha) for s in stats],
    )


def list_repo(
    repo_id: str, access: HubAccess, repo_type: str = "model", revision: str | None = None
) -> Listing:
    """The repo's files with sizes and digests at `revision` (default: the main branch's head commit).

    Raises DownloadError: missing or not visible (which private repos look like without a token), gated,
    an unknown revision, or the hub unreachable after a few tries.
    """
    import httpx
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{repo_type} repo {repo_id!r} on {access.endpoint}"
    api = HfApi(endpoint=access.endpoint, token=access.token or False)
    for attempt in range(1, LIST_ATTEMPTS + 1):
        try:
            info = (api.dataset_info if repo_type == "dataset" else api.model_info)(
                repo_id, revision=revision, files_metadata=True
            )
            break
        except GatedRepoError as exc:
            raise DownloadError(
                f"{what} is gated: accept its terms with the token's account ({access.token_note})"
            ) from exc
        except RepositoryNotFoundError as exc:
            raise DownloadError(
                f"{what} not found, or private and not visible ({access.token_note})"
            ) from exc
        except RevisionNotFoundError as exc:
            raise DownloadError(f"{what} has no revision {revision!r}") from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if (status != 429 and status < 500) or attempt == LIST_ATTEMPTS:
                raise DownloadError(f"{what}: the hub answered HTTP {status} ({access.token_note})") from exc
        except (httpx.TransportError, OSError) as exc:  # refused, reset, timed out; offline mode
            if attempt == LIST_ATTEMPTS:
                raise DownloadError(f"{what}: cannot reach the hub: {type(exc).__name__}: {exc}") from exc
        time.sleep(attempt)
    files = []
    for sibling in info.siblings or []:
        if sibling.size is None:
            raise DownloadError(f"{what}: the listing gives no size for {sibling.rfilename}")
        lfs = sibling.lfs
        files.append(
            RemoteFile(
                sibling.rfilename, sibling.size, lfs.sha256 if lfs else None, None if lfs else sibling.blob_id
            )
        )
    if not info.sha:
        raise DownloadError(f"{what}: the listing gives no commit sha")
    return Listing(repo_id, repo_type, info.sha, tuple(files))


def weight_format(path: str) -> str | None:
    """The weight file suffix of `path` ('.safetensors', '.bin', ...; index files count as their format)."""
    name = path.rsplit("/", 1)[-1].lower().removesuffix(".index.json")
    return next((suffix for suffix in WEIGHT_SUFFIXES if name.endswith(suffix)), None)


def model_files(listing: Listing) -> list[RemoteFile]:
    """The files of a model repo that transformers loads it from (the rule is in the module docstring).

    Raises DownloadError when the repo has neither safetensors nor PyTorch weights.
    """

    def for_runtime(f: RemoteFile) -> bool:
        return "/" in f.path and f.path.split("/", 1)[0] in RUNTIME_FOLDERS

    formats = {weight_format(f.path) for f in listing.files if not for_runtime(f)} - {None}
    if SAFETENSORS in formats:
        keep = {SAFETENSORS}
    elif formats & PYTORCH:
        keep = set(PYTORCH)
    else:
        found = ", ".join(sorted(str(f) for f in formats)) or "no weight files"
        raise DownloadError(
            f"model repo {listing.repo_id!r} has no safetensors or PyTorch weights ({found}); "
            "transformers cannot load it"
        )
    names = [f.path.rsplit("/", 1)[-1] for f in listing.files]
    has_transformers_st = any(n.startswith("model") and weight_format(n) == SAFETENSORS for n in names)

    def needed(f: RemoteFile) -> bool:
        fmt = weight_format(f.path)
        if for_runtime(f) or (fmt is not None and fmt not in keep):
            return False
        return not (has_transformers_st and fmt == SAFETENSORS and f.path.startswith("consolidated"))

    return [f for f in listing.files if needed(f)]


def repo_cache_dir(cache_dir: Path, repo_type: str, repo_id: str) -> Path:
    """``<cache_dir>/hub/<repo_type>s--<org>--<name>``: every commit of the repo is a directory in it."""
    return cache_dir / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"


def download(
    listing: Listing,
    files: Sequence[RemoteFile],
    dest: Path,
    access: HubAccess,
    *,
    part_size: int | None = None,
    retries: int = DEFAULT_RETRIES,
) -> DownloadStats:
    """Fetch `files` of `listing` into `dest` (the repo's layout), skipping what a previous run finished.

    Raises DownloadError naming the repo, the commit and the file; what was fetched stays for a re-run.
    """
    from huggingface_hub import hf_hub_url

    started = time.monotonic()
    kind = listing.repo_type

    def url(path: str) -> str:
        return hf_hub_url(
            listing.repo_id, path, repo_type=kind, revision=listing.sha, endpoint=access.endpoint
        )

    items = [Item(f.path, url(f.path), f.size, f.sha256, f.git_oid) for f in files]
    meta = {"repo_id": listing.repo_id, "repo_type": kind, "sha": listing.sha}
    headers = {"User-Agent": "trainfleet"}
    if access.token:
        headers["Authorization"] = f"Bearer {access.token}"
    try:
        done = transfer(
            items,
            dest,
            headers,
            connections=access.connections,
            part_size=part_size,
            retries=retries,
            meta=meta,
        )
    except DownloadError as exc:
        where = f"{kind} repo {listing.repo_id!r} at {listing.sha[:12]}"
        raise DownloadError(f"{where}: {exc} ({access.token_note})") from exc
    return DownloadStats(
        repo_id=listing.repo_id,
        repo_type=kind,
        sha=listing.sha,
        bytes=done.bytes,
        files=done.files,
        bytes_skipped=done.bytes_skipped,
        files_skipped=done.files_skipped,
        unneeded=len(listing.files) - len(files),
        seconds=time.monotonic() - started,
        connections=done.connections,
        requests=done.requests,
        retries=done.retries,
    )


def snapshot(
    repo_id: str, cache_dir: Path, access: HubAccess, repo_type: str = "model", select: Select | None = None
) -> Snapshot:
    """List `repo_id` at its head commit and fetch what `select` picks (default: every file) into
    ``repo_cache_dir(...)/<sha>``. A second call for the same commit fetches nothing (it still lists).

    The figures' `seconds` cover the listing as well, so they tell what the node waited for.
    """
    started = time.monotonic()
    listing = list_repo(repo_id, access, repo_type)
    files = tuple(select(listing) if select is not None else listing.files)
    folder = repo_cache_dir(cache_dir, repo_type, repo_id) / listing.sha
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder.parent / f".{listing.sha}.lock"):
        stats = download(listing, files, folder, access)
    took = time.monotonic() - started
    return Snapshot(folder, files, replace(stats, seconds=took))
