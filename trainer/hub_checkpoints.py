"""Checkpoints on the HF Hub (`hub_strategy`), so that a run can resume on another node.

With `hub_model_id` and `hub_strategy` set as in transformers: `checkpoint` and `every_save` keep the
newest checkpoint in the repository's `last-checkpoint/` folder (replaced at each save);
`all_checkpoints` keeps each as `checkpoints/step-N/`; `end` (the default) pushes nothing but the result.
Rank 0 pushes right after writing the checkpoint locally; a failed push is reported and training goes on
(the local checkpoint still stands). Before training starts on a node that has no checkpoint of the run,
the newest one on the hub (if any) is fetched into `<work_dir>/checkpoints/step-N`, where the trainer
resumes from it as from its own.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from trainer import outputs
from trainer.config import TrainJob

if TYPE_CHECKING:
    from huggingface_hub import HfApi

LAST = "last-checkpoint"
ALL = "checkpoints"
STEP_DIR = re.compile(rf"^(?:{LAST}|{ALL}/step-\d+)/")


def _enabled(job: TrainJob) -> bool:
    return bool(job.config.hub_model_id) and job.config.hub_strategy != "end"


def _api() -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=os.environ.get("HF_TOKEN") or None)


def push(path: Path, job: TrainJob) -> str | None:
    """Upload the checkpoint at `path` per the job's hub_strategy; the folder it went to, or None (not
    asked for, or the push failed, which is said on stderr)."""
    if not _enabled(job):
        return None
    from huggingface_hub.errors import HfHubHTTPError

    repo_id = str(job.config.hub_model_id)
    folder = f"{ALL}/{path.name}" if job.config.hub_strategy == "all_checkpoints" else LAST
    api = _api()
    try:
        api.create_repo(repo_id, private=job.config.hub_private_repo, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=path,
            path_in_repo=folder,
            commit_message=f"trainfleet run {job.run_id}: {path.name}",
            delete_patterns="*" if folder == LAST else None,
        )
    except (HfHubHTTPError, OSError) as exc:
        print(f"trainer: warning: could not push {path.name} to {repo_id}: {exc}", file=sys.stderr)
        return None
    return folder


def fetch_newest(job: TrainJob) -> Path | None:
    """When this node has no checkpoint of the run, bring the newest one from the hub (None: none there,
    or hub checkpoints are not asked for)."""
    root = Path(job.work_dir) / outputs.CHECKPOINTS_DIR
    if not _enabled(job) or outputs.latest_checkpoint(root) is not None:
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    repo_id = str(job.config.hub_model_id)
    api = _api()
    try:
        files = api.list_repo_files(repo_id)
    except (HfHubHTTPError, OSError):
        return None  # no repository yet: a fresh start
    folders = {m.group(0).rstrip("/") for f in files if (m := STEP_DIR.match(f))}
    if not folders:
        return None
    with tempfile.TemporaryDirectory(dir=root.parent if root.parent.is_dir() else None) as tmp:
        snapshot_download(
            repo_id,
            allow_patterns=[f"{folder}/*" for folder in folders],
            local_dir=tmp,
            cache_dir=Path(tmp) / ".cache",
            endpoint=os.environ.get("HF_ENDPOINT") or None,
            token=os.environ.get("HF_TOKEN") or None,
        )
        complete = [Path(tmp, f) for f in folders if outputs.is_complete(Path(tmp, f))]
        if not complete:
            return None
        newest = max(complete, key=lambda d: outputs.read_state(d)["global_step"])
        step = outputs.read_state(newest)["global_step"]
        target = root / f"step-{step}"
        root.mkdir(parents=True, exist_ok=True)
        shutil.move(str(newest), str(target))
    return target
