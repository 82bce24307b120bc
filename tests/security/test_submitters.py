"""Issue 39, items 1 and 6: what a job may do depends on who sent it.

A Discord user or a committer to a watched repository is not the fleet's owner. By default their jobs may
not run on the fleet's own machine (the local provider runs the job's code there) and may not push to the
Hub with the fleet's HF token; the operator grants either (FLEET_LOCAL_JOBS_FROM, FLEET_HUB_NAMESPACES by
Discord user, Discord role, or repository). A refusal names the key and its line, and nothing is queued.

Through the bot's own dispatch against the fake Discord (tests/integration/test_bot.py's harness), the git
trigger's look on a real repository, and service.runs for the CLI. Before issue 39 every one of these jobs
was queued.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from core.errors import ConfigError
from core.policy_settings import Source
from core.settings import Settings
from jobs.spec import format_problems, parse_job
from providers.world import World
from service import gitwatch
from service.gitrepo import GitRepo
from service.runs import Fleet, check_submittable, submit
from state.keys import RUNS_INDEX
from state.payloads import DiscordOrigin, GitOrigin
from tests.fakes import FakeDiscord
from tests.integration.test_bot import ALLOWED_ROLE, ALLOWED_USER, CHANNEL, CONFIGS, TINY, Harness, run_bot
from tests.integration.test_git_trigger import Repo

pytestmark = pytest.mark.integration

PUSHING = TINY + b"hub_model_id: acme/tiny-lora\n"
HUB_LINE = PUSHING.decode().splitlines().index("hub_model_id: acme/tiny-lora") + 1
LOCAL_LINE = TINY.decode().splitlines().index("local:") + 1
ROLE = 720000000000000042


@pytest.fixture
def settings(
    fake_discord: FakeDiscord, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("FLEET_SECRETS_FILE", str(tmp_path / "missing.yml"))
    return Settings(
        redis_url=redis_url,
        home=tmp_path / "home",
        discord_api_base=f"{fake_discord.url}/api/v10",
        discord_allowed_users=(ALLOWED_USER,),
        discord_allowed_roles=(ALLOWED_ROLE,),
        discord_allowed_channels=(CHANNEL,),
        bot_configs_dir=CONFIGS,
        data_roots=(CONFIGS / "data",),
    )


def _fleet(settings: Settings, **update: Any) -> Fleet:
    return Fleet.connect(World.of(settings.model_copy(update=update)))


def _refusal(record: dict[str, Any]) -> str:
    """The text of a private refusal the bot answered with."""
    callback = record["callbacks"][0]
    assert callback["type"] == 4 and int(callback["data"]["flags"]) & 64, record
    embed = callback["data"]["embeds"][0]
    assert embed["title"] in ("Invalid job", "Invalid sweep"), embed
    return str(embed["description"])


def test_discord_jobs_do_not_run_on_the_fleet_machine_unless_granted(
    settings: Settings, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    """/train and /sweep of a local job are refused by default, naming `local:` and its line; granted
    (FLEET_LOCAL_JOBS_FROM=cli,discord), the run is queued and records who sent it."""
    fleet = _fleet(settings)
    sweep = b"learning_rate: [0.01, 0.02]\n"

    async def refused(h: Harness) -> None:
        for command, options in (
            ("train", {"config": "tiny-lora.yml"}),
            ("train", {"file": ("tiny-lora.yml", TINY)}),
            ("sweep", {"config": "tiny-lora.yml", "sweep_file": ("sweep.yml", sweep)}),
        ):
            why = _refusal(await h.invoke(command, options))
            assert f":{LOCAL_LINE}: local: cannot submit: a local job runs its code on the fleet's own" in why
            assert "FLEET_LOCAL_JOBS_FROM" in why
        assert redis_client.zcard(RUNS_INDEX) == 0

    run_bot(fleet, fake_discord, refused)
    granted = _fleet(settings, local_jobs_from=(Source.CLI, Source.DISCORD))

    async def queued(h: Harness) -> None:
        record = await h.invoke("train", {"config": "tiny-lora.yml"}, roles=(ROLE, ALLOWED_ROLE))
        assert record["callbacks"][0]["type"] == 5, record  # deferred: it was taken

    run_bot(granted, fake_discord, queued)
    (run,) = granted.ledger.list_runs()
    assert run.origin == DiscordOrigin(
        user_id=str(ALLOWED_USER), role_ids=tuple(sorted((str(ROLE), str(ALLOWED_ROLE))))
    )


def test_a_job_with_no_provider_section_from_discord_is_refused_too(settings: Settings) -> None:
    """The default provider is this machine: a job that names none is a local job, and says why."""
    bare = TINY.replace(b"local:\n  one_shot: true\n", b"")
    job = parse_job(bare, source="bare.yml", base_dir=CONFIGS)
    with pytest.raises(ConfigError) as refused:
        check_submittable(World.of(settings), job, DiscordOrigin(user_id="1"))
    assert "a job with no provider section (FLEET_DEFAULT_PROVIDER: local)" in format_problems(refused.value)
    check_submittable(World.of(settings), job)  # the CLI's


def test_git_jobs_do_not_run_on_the_fleet_machine_unless_granted(
    settings: Settings, redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """A committed local config is refused by a look (kept for the next look, nothing queued), and queued
    once the operator grants git jobs this machine."""
    repo = Repo(tmp_path / "repo")
    fleet = _fleet(settings)
    trigger = gitwatch.Trigger(fleet, GitRepo.open(repo.root), "watched", [gitwatch.DEFAULT_GLOB])
    start = repo.git("rev-parse", "HEAD")
    repo.write("a.yml", 1)
    head = repo.commit("a local job")
    look = gitwatch.look(trigger, "main", head, since=start)
    (result,) = look.results
    assert result.outcome is gitwatch.Outcome.REFUSED, result
    assert ": local: cannot submit: a local job runs its code on the fleet's own machine" in result.message
    assert redis_client.zcard(RUNS_INDEX) == 0

    granted = _fleet(settings, local_jobs_from=(Source.CLI, Source.GIT))
    trigger = gitwatch.Trigger(granted, GitRepo.open(repo.root), "watched", [gitwatch.DEFAULT_GLOB])
    (result,) = gitwatch.look(trigger, "main", head, since=start).results
    assert result.outcome is gitwatch.Outcome.ENQUEUED, result
    assert granted.ledger.get_run(str(result.run_id)).origin == GitOrigin(
        repo="watched", branch="main", commit=head, path="tasks/a.yml"
    )


def _push_refusal(settings: Settings, origin: DiscordOrigin | GitOrigin | None, text: bytes = PUSHING) -> str:
    """Why the job `text` is refused when `origin` submits it (the local provider allowed to all)."""
    allowed = settings.model_copy(update={"local_jobs_from": tuple(Source)})
    job = parse_job(text, source="push.yml", base_dir=CONFIGS)
    with pytest.raises(ConfigError) as refused:
        check_submittable(World.of(allowed), job, origin)
    return format_problems(refused.value)


def test_a_push_goes_only_where_its_sender_is_granted(settings: Settings) -> None:
    """hub_model_id is checked against FLEET_HUB_NAMESPACES before the token is even looked at: nobody but
    the CLI may push by default; a grant by Discord user, Discord role or repository names namespaces.
    A granted push gets as far as the next check (no HF_TOKEN in this fleet)."""
    user = DiscordOrigin(user_id="11", role_ids=(str(ROLE),))
    commit = GitOrigin(repo="github.com/acme/models", commit="0" * 40)
    token_missing = "pushing to the hub needs HF_TOKEN"
    for origin, sender in ((user, "discord:user:11"), (commit, "git:github.com/acme/models")):
        why = _push_refusal(settings, origin)
        assert f"push.yml:{HUB_LINE}: hub_model_id: cannot submit: jobs from {sender} may not push" in why
    assert token_missing in _push_refusal(settings, None)  # the fleet's owner

    grants = {
        "discord:role:720000000000000042": ("acme",),
        "git:github.com/acme/models": ("acme",),
        "discord:user:12": ("*",),
    }
    granted = settings.model_copy(update={"hub_namespaces": grants})
    assert token_missing in _push_refusal(granted, user)  # by its role
    assert token_missing in _push_refusal(granted, commit)
    assert token_missing in _push_refusal(granted, DiscordOrigin(user_id="12"))  # anywhere
    elsewhere = PUSHING.replace(b"acme/tiny-lora", b"someone-else/tiny-lora")
    why = _push_refusal(granted, user, elsewhere)
    assert "may push only to acme, not to someone-else" in why
    bare = PUSHING.replace(b"acme/tiny-lora", b"tiny-lora")  # the token's own namespace: which is unknown
    assert "name the namespace (acme/tiny-lora)" in _push_refusal(granted, commit, bare)
    assert "jobs from discord:user:13 may not push" in _push_refusal(granted, DiscordOrigin(user_id="13"))
    owner_bound = settings.model_copy(update={"hub_namespaces": {"cli": ("me",)}})
    assert "jobs from cli may push only to me, not to acme" in _push_refusal(owner_bound, None)


def test_a_discord_push_is_refused_before_anything_is_queued(
    settings: Settings, fake_discord: FakeDiscord, redis_client: redis.Redis[str]
) -> None:
    """Through /train: the refusal names hub_model_id and its line, privately; nothing is queued."""
    fleet = _fleet(settings, local_jobs_from=(Source.CLI, Source.DISCORD))

    async def scenario(h: Harness) -> None:
        why = _refusal(await h.invoke("train", {"file": ("push.yml", PUSHING)}))
        assert (
            f"push.yml:{HUB_LINE}: hub_model_id: cannot submit: jobs from discord:user:{ALLOWED_USER}" in why
        )
        assert redis_client.zcard(RUNS_INDEX) == 0

    run_bot(fleet, fake_discord, scenario)


def test_the_cli_keeps_its_own_machine(settings: Settings, redis_client: redis.Redis[str]) -> None:
    """The fleet's owner is not bound by these rules: the CLI's local job is queued as before."""
    fleet = _fleet(settings)
    run = submit(fleet, parse_job(TINY, source="cli.yml", base_dir=CONFIGS))
    assert run.origin is None and redis_client.zcard(RUNS_INDEX) == 1
