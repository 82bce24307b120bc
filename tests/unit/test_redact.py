"""jobs.redact: the job file as a model card shows it, with nothing secret left in it."""

from __future__ import annotations

import yaml

from jobs.redact import REDACTED, redact_job

JOB = """\
base_model: trainfleet/tiny-llama   # a comment
datasets:
  - path: data/tiny.jsonl
    type: alpaca
wandb_project: demo
hub_model_id: me/tiny
notes: trained with hf_canarycanarycanary in mind
runpod:
  gpu: NVIDIA RTX A5000
  env:
    DATABASE_URL: postgres://user:canarypass@db/x
    DEBUG: 1
  registry_auth: canary-auth
"""


def test_env_values_secret_keys_and_known_values_are_taken_out() -> None:
    shown = redact_job(JOB, ["hf_canarycanarycanary", "demo"])
    for secret in ("canarypass", "canary-auth", "hf_canarycanarycanary"):
        assert secret not in shown
    data = yaml.safe_load(shown)
    assert data["runpod"]["env"] == {"DATABASE_URL": REDACTED, "DEBUG": REDACTED}
    assert data["runpod"]["registry_auth"] == REDACTED
    # What is not secret reads as before (short "secrets" do not blank out ordinary text).
    assert data["base_model"] == "trainfleet/tiny-llama" and data["runpod"]["gpu"] == "NVIDIA RTX A5000"
    assert data["datasets"] == [{"path": "data/tiny.jsonl", "type": "alpaca"}]
    assert data["notes"] == f"trained with {REDACTED} in mind" and data["wandb_project"] == "demo"
