"""`private_image`: the image's registry as docker finds it, the section's check, the fleet's logins in its
settings (RunPod's auth ids) and secrets (vast.ai's docker logins), and the refusal at submit, with the key
and line, of a job whose cloud has no login for its image's registry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.errors import ConfigError
from core.secrets import Secrets, load_secrets
from core.settings import load_settings
from jobs.images import registry_of
from jobs.spec import LoadedJob, format_problems, load_job
from providers.registry import CREDENTIAL_NAMES, FleetSettings
from providers.vastai.settings import REGISTRY_LOGINS, registry_logins
from providers.world import World
from service.runs import check_submittable
from tests.factories import RUNPOD_SECTION, VASTAI_SECTION, light_job_file

IMAGE = "ghcr.io/acme/trainer:1"
TOKEN = "ghp_pulltoken0123456789"


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("ghcr.io/acme/trainer:1", "ghcr.io"),
        ("registry.example.com:5000/team/img@sha256:abc", "registry.example.com:5000"),
        ("localhost/img", "localhost"),
        ("localhost:5000/img:2", "localhost:5000"),
        ("axolotlai/axolotl:0.19.0", "docker.io"),
        ("ubuntu", "docker.io"),
        ("index.docker.io/acme/img", "docker.io"),
        ("GHCR.IO/acme/img", "ghcr.io"),
        ("acme/team/img", "docker.io"),
    ],
)
def test_an_images_registry_is_the_one_docker_pulls_it_from(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def job(tmp_path: Path, section: str, keys: str) -> LoadedJob:
    return load_job(light_job_file(tmp_path / "job", section + keys))


def test_a_private_image_must_be_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        job(tmp_path, RUNPOD_SECTION, "  private_image: true\n")
    (problem,) = caught.value.problems
    assert problem.path == "runpod.private_image" and problem.line is not None
    assert "set `image`" in problem.message
    assert job(tmp_path / "2", RUNPOD_SECTION, f"  image: {IMAGE}\n  private_image: true\n").spec.section


def test_runpod_auths_come_from_the_settings_by_registry() -> None:
    env = {"FLEET_SETTINGS_FILE": os.devnull, "FLEET_RUNPOD_REGISTRY_AUTHS": '{"GHCR.io": "cl4abc_9"}'}
    settings = load_settings(env, FleetSettings)
    assert settings.runpod_registry_auths == {"ghcr.io": "cl4abc_9"}  # type: ignore[attr-defined]
    for bad, said in (('{"ghcr.io": "a b"}', "not a RunPod container registry auth's id"), ("[1", "JSON")):
        with pytest.raises(ConfigError) as caught:
            load_settings({**env, "FLEET_RUNPOD_REGISTRY_AUTHS": bad}, FleetSettings)
        assert said in format_problems(caught.value)


def test_vast_logins_are_a_secret_by_registry_never_shown(tmp_path: Path) -> None:
    assert REGISTRY_LOGINS in CREDENTIAL_NAMES
    secrets_file = tmp_path / "secrets.yml"
    secrets_file.write_text(f"{REGISTRY_LOGINS}:\n  ghcr.io: acme-bot:{TOKEN}\n  Docker.io: me:dckr_1\n")
    secrets_file.chmod(0o600)
    secrets = load_secrets({"FLEET_SECRETS_FILE": str(secrets_file)}, known=CREDENTIAL_NAMES)
    assert registry_logins(secrets.get(REGISTRY_LOGINS)) == {
        "ghcr.io": f"-u acme-bot -p {TOKEN} ghcr.io",
        "docker.io": "-u me -p dckr_1 docker.io",
    }
    no_user, spaced = f'{{"ghcr.io": "{TOKEN}"}}', f'{{"ghcr.io": "u:{TOKEN} x"}}'
    for bad in (no_user, spaced, f'{{"a b": "u:{TOKEN}"}}', TOKEN):
        with pytest.raises(ValueError) as caught:
            registry_logins(SecretStr(bad))
        assert TOKEN not in str(caught.value) and REGISTRY_LOGINS in str(caught.value)


def world(tmp_path: Path, secrets: dict[str, str], **settings: object) -> World:
    values = {k: SecretStr(v) for k, v in secrets.items()}
    return World.of(FleetSettings(home=tmp_path / "home", **settings), Secrets(values, tmp_path / "none.yml"))


RUNPOD_KEY = {"RUNPOD_API_KEY": "rp-key"}
PRIVATE = f"  image: {IMAGE}\n  private_image: true\n"


def test_a_job_whose_cloud_has_no_login_for_its_registry_is_refused_at_its_key(tmp_path: Path) -> None:
    loaded = job(tmp_path, RUNPOD_SECTION, PRIVATE)
    with pytest.raises(ConfigError) as caught:
        check_submittable(world(tmp_path, RUNPOD_KEY, runpod_registry_auths={"docker.io": "cl1"}), loaded)
    (problem,) = caught.value.problems
    assert problem.path == "runpod.private_image" and problem.line is not None
    assert "cannot submit: image ghcr.io/acme/trainer:1 is private" in problem.message
    assert "no RunPod login for ghcr.io" in problem.message
    assert "FLEET_RUNPOD_REGISTRY_AUTHS" in problem.message
    check_submittable(world(tmp_path, RUNPOD_KEY, runpod_registry_auths={"ghcr.io": "cl1"}), loaded)

    vast = job(tmp_path / "2", VASTAI_SECTION, PRIVATE)
    keys = {"VAST_API_KEY": "va-key", REGISTRY_LOGINS: f'{{"ghcr.io": "{TOKEN}"}}'}  # malformed: no user
    with pytest.raises(ConfigError) as caught:
        check_submittable(world(tmp_path, keys), vast)
    said = format_problems(caught.value)
    assert "vastai.private_image" in said and "login must be user:token" in said and TOKEN not in said
    check_submittable(world(tmp_path, {**keys, REGISTRY_LOGINS: f'{{"ghcr.io": "bot:{TOKEN}"}}'}), vast)


def test_a_cloud_job_needs_one_cloud_with_the_login(tmp_path: Path) -> None:
    section = "cloud:\n  gpu: RTX-A5000\n  clouds: [runpod, vastai]\n"
    loaded = job(tmp_path, section, PRIVATE)
    keys = {**RUNPOD_KEY, "VAST_API_KEY": "va-key"}
    with pytest.raises(ConfigError) as caught:
        check_submittable(world(tmp_path, keys), loaded)
    (problem,) = caught.value.problems
    assert problem.path == "cloud.private_image" and problem.line is not None
    assert "runpod: image" in problem.message and "vastai: image" in problem.message
    check_submittable(world(tmp_path, keys, runpod_registry_auths={"ghcr.io": "cl1"}), loaded)
