"""Issue 19, findings 12b and 12c at validate: a job file is refused when any value in it looks like a
credential (by its key and line, never showing the value), and when its `entry` is not a shell script
that parses; values that got past (a run submitted before) are blanked before the W&B config."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError, Problem
from jobs.spec import format_problems, parse_job
from service.sweep_load import parse_sweep
from tests.wandb_log import read_finished_run
from trainer.config import WandbPlan
from trainer.tracking import open_run

HEAD = "base_model: trainfleet/tiny-llama\ndatasets:\n  - path: tatsu-lab/alpaca\n"
# Canaries shaped like each vendor's credential (none is real).
HF = "hf_" + "Zq7Lm2Xw9Rt4" * 3
CREDENTIALS = {
    "Hugging Face token": HF,
    "RunPod API key": "rpa_" + "K8sd7Fh2Lq9Wm3Zx" * 3,
    "OpenAI-style API key": "sk-proj-" + "Ab12Cd34Ef56Gh78" * 3,
    "GitHub token": "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5",
    "GitHub token ": "github_pat_11AB" + "cD3eF5gH7jK9mN1pQ3sT5" * 3,
    "AWS access key id": "AKIAIOSFODNN7EXAMPLE",
    "Discord bot token": "MTA4NzE2Mzk0NTU2MDU3NjA3OQ.GxYz12.abcdefghijklmnopqrstuvwxyz0123456789AB",
    "private key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n",
    "W&B API key": "local-" + "0123456789abcdef" * 2 + "01234567",
}


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        parse_job(text.encode(), source="job.yml", base_dir=Path.cwd())
    return info.value.problems


def refused_without_echo(text: str, secret: str) -> list[Problem]:
    """The problems of `text`; none of them, nor the printed form, shows `secret`."""
    with pytest.raises(ConfigError) as info:
        parse_job(text.encode(), source="job.yml", base_dir=Path.cwd())
    shown = format_problems(info.value) + str(info.value)
    assert secret.strip() not in shown and secret.splitlines()[0] not in shown
    return info.value.problems


def test_a_token_in_a_pass_through_key_is_refused_by_key_and_line() -> None:
    """12c: `hub_token: hf_...` is a key trainfleet passes through untouched; it used to validate."""
    (problem,) = refused_without_echo(HEAD + "hub_model_id: me/tiny\nhub_token: " + HF + "\n", HF)
    assert (problem.path, problem.line) == ("hub_token", 5)
    assert "looks like an access token (a Hugging Face token)" in problem.message
    assert "secrets do not belong in the job file" in problem.message


@pytest.mark.parametrize("what", sorted(CREDENTIALS))
def test_every_kind_of_credential_is_refused_anywhere_nested_or_in_env(what: str) -> None:
    secret = CREDENTIALS[what]
    quoted = '"' + secret.replace("\n", "\\n") + '"'
    text = (
        HEAD.replace("tatsu-lab/alpaca\n", "tatsu-lab/alpaca\n    notes: [fine, " + quoted + "]\n")
        + "runpod:\n  gpu_count: 1\n  env:\n    SOME_SETTING: "
        + quoted
        + "\n"
    )
    problems = refused_without_echo(text, secret)
    assert {(p.path, p.line) for p in problems} == {
        ("datasets[0].notes[1]", 4),
        ("runpod.env.SOME_SETTING", 8),
    }
    assert all(what.strip() in p.message for p in problems), problems


def test_any_value_under_a_key_named_like_a_credential_is_refused() -> None:
    # A W&B key is 40 hex digits, as a git commit is: under a credential's name it is refused...
    key = "0123456789abcdef0123456789abcdef01234567"
    text = HEAD + f"wandb_api_key: {key}\nmy_settings:\n  db_password: hunter2\n  apiKey: 42\n"
    problems = refused_without_echo(text, key)
    assert [(p.path, p.line) for p in problems] == [
        ("wandb_api_key", 4),
        ("my_settings.db_password", 6),
        ("my_settings.apiKey", 7),
    ]
    assert all("the key names a secret" in p.message for p in problems)
    assert "hunter2" not in str(problems)


def test_what_only_looks_like_a_credential_by_name_or_shape_is_kept() -> None:
    """A commit sha, the tokenizer's tokens, a flag that says to use a token: not credentials."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    text = (
        "trainer: axolotl\n"
        + HEAD.replace(
            "tatsu-lab/alpaca\n", "tatsu-lab/alpaca\n    type: alpaca\n    revision: " + sha + "\n"
        )
        + "special_tokens:\n  pad_token: <|end_of_text|>\n  bos_token: <s>\n"
        + "hf_use_auth_token: true\ntokenizer_type: AutoTokenizer\neval_max_new_tokens: 8\n"
    )
    job = parse_job(text.encode(), source="job.yml", base_dir=Path.cwd())
    assert job.spec.train.model_extra is not None
    assert job.spec.train.model_extra["special_tokens"]["pad_token"] == "<|end_of_text|>"


def test_a_secret_in_a_sweep_is_refused_where_the_sweep_wrote_it() -> None:
    text = HEAD + "sweep:\n  grid:\n    wandb_name: [a-public-word, " + HF + "]\n"
    with pytest.raises(ConfigError) as info:
        parse_sweep(text.encode(), source="sweep.yml", base_dir=Path.cwd())
    shown = format_problems(info.value)
    assert HF not in shown and "looks like an access token" in shown
    assert any(p.line == 6 and p.path.startswith("sweep.grid.wandb_name") for p in info.value.problems)


def test_an_entry_with_an_unbalanced_quote_is_refused_at_validate() -> None:
    """12b: refused by key and line with the shell's own words (`sh -n`, the grammar of the shell that runs
    it on the node), rather than failing later on the node."""
    for script in ('pip install "flash-attn', "echo 'it", "echo `date"):
        (problem,) = problems_of(HEAD + "runpod:\n  gpu_count: 1\n  entry: " + repr(script) + "\n")
        assert (problem.path, problem.line) == ("runpod.entry", 6)
        assert problem.message.startswith("is not a valid POSIX shell script: line 1 of the script")


def test_a_valid_script_that_shlex_cannot_split_is_kept() -> None:
    """Why the check is the shell's and not shlex's: a heredoc or a comment may hold a lone quote."""
    script = "cat > notes.txt <<EOF\nit's fine\nEOF\necho done # it's done\n"
    indented = "".join(f"    {line}\n" for line in script.splitlines())
    job = parse_job((HEAD + "runpod:\n  entry: |\n" + indented).encode(), source="j", base_dir=Path.cwd())
    assert getattr(job.spec.section, "entry", None) == script


def test_the_wandb_config_never_holds_a_secret_looking_value(tmp_path: Path) -> None:
    """12c, on the node: a config that got past validate (a run from before the check) is blanked on its
    way into the W&B run's config; tokenizer keys and plain values stay."""
    plan = WandbPlan(run_id="tf-sec1", project="tiny", mode="offline")
    config = {
        "hub_token": HF,
        "comet_api_key": "abc123",
        "notes": ["fine", CREDENTIALS["AWS access key id"]],
        "special_tokens": {"pad_token": "<pad>"},
        "learning_rate": 0.001,
    }
    run = open_run(plan, "sec1", tmp_path, config)
    run.finish()
    (log,) = tmp_path.glob("wandb/offline-run-*/run-tf-sec1.wandb")
    written = read_finished_run(log).config
    assert written["hub_token"] == "<redacted>" and written["comet_api_key"] == "<redacted>"
    assert written["notes"] == ["fine", "<redacted>"]
    assert written["special_tokens"] == {"pad_token": "<pad>"} and written["learning_rate"] == 0.001
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert HF.encode() not in data and b"AKIAIOSFODNN7EXAMPLE" not in data, path
