"""Publishing a run's results to the Hugging Face Hub from the node: `python -m trainer push`.

The node holds the results and (through the Ray job's environment) HF_TOKEN, so the push goes from there:
no size limit, and nothing large crosses back to the fleet. The repository is created when missing,
private unless the job says `hub_private_repo: false` (an existing repository keeps its visibility), and
the output directory is uploaded as one commit; re-running it changes nothing that is already there.
HF_ENDPOINT (and HF_HUB_DISABLE_XET) come from the environment, as huggingface_hub reads them itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer import lines
from trainer.config import TrainJob
from trainer.errors import TrainerError


class PushFailed(TrainerError):
    """The hub refused the push or could not be reached."""


def push(job: TrainJob) -> lines.Pushed:
    """Upload `job.output_dir` to `hub_model_id`; emit PUSHED (the repository, its commit and its page)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    repo_id = job.config.hub_model_id
    if not repo_id:
        raise PushFailed("the job has no hub_model_id: nothing to push")
    out = Path(job.output_dir)
    if not (out / "adapter_config.json").is_file():
        raise PushFailed(f"{out} holds no adapter: train before pushing")
    token = os.environ.get("HF_TOKEN") or None
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)
    try:
        repo = api.create_repo(repo_id, private=job.config.hub_private_repo, exist_ok=True)
        repo_id = repo.repo_id  # `name` alone is in the token's namespace: the hub says which
        info = api.upload_folder(
            repo_id=repo_id, folder_path=out, commit_message=f"trainfleet run {job.run_id}"
        )
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "no answer"
        hint = " (is HF_TOKEN set, with write access?)" if status in (401, 403) else ""
        raise PushFailed(f"the hub refused the push to {repo_id}: HTTP {status}{hint}") from None
    except OSError as exc:
        raise PushFailed(f"cannot reach the hub to push {repo_id}: {exc}") from None
    pushed = lines.Pushed(repo_id=repo_id, commit=str(info.oid), url=str(repo.url))
    lines.emit(pushed)
    return pushed
