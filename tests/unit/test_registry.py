"""Providers declare themselves: the registry, the job's section models and what the fleet derives from
the declarations (credential names, API URLs) agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.errors import ConfigError, ProviderError
from core.secrets import FLEET_CREDENTIALS
from core.settings import Settings
from jobs.sections import ProviderName, provider_names, section_models
from providers.base import ProviderContext
from providers.registry import (
    CREDENTIAL_NAMES,
    PROVIDERS,
    FleetSettings,
    api_url_setting,
    api_urls,
    cloud_settings,
    fleet_runs,
    get_provider,
    provider_name,
)
from providers.remote import RemoteProvider
from providers.runpod.settings import RunPodSettings
from providers.world import load_fleet_settings

NAMES = sorted(name for name in provider_names() if not name.is_choice)


def test_every_provider_name_is_registered_under_its_own_name() -> None:
    assert set(PROVIDERS) == set(NAMES)  # `cloud` is a choice among them, made per run
    for name, cls in PROVIDERS.items():
        assert cls.name == name, cls


def test_cloud_is_no_provider_of_its_own_and_says_what_it_chooses_among() -> None:
    context = ProviderContext(home=Path("/nonexistent"))
    with pytest.raises(ProviderError, match="cloud is a choice among runpod, vastai, not one provider"):
        get_provider("cloud", context)


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_a_provider_s_section_model_is_the_job_s(name: ProviderName) -> None:
    assert PROVIDERS[name].section_model is section_models()[name]


def test_the_known_credentials_are_every_provider_s_and_the_fleet_s() -> None:
    for cls in PROVIDERS.values():
        assert set(cls.credential_names) <= set(CREDENTIAL_NAMES), cls
    assert set(FLEET_CREDENTIALS) <= set(CREDENTIAL_NAMES)
    assert len(CREDENTIAL_NAMES) == len(set(CREDENTIAL_NAMES))
    assert PROVIDERS[ProviderName("runpod")].credential_names == ("RUNPOD_API_KEY",)
    assert PROVIDERS[ProviderName("vastai")].credential_names == ("VAST_API_KEY",)
    assert PROVIDERS[ProviderName.LOCAL].credential_names == ()


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_a_cloud_declares_its_api_url_and_the_setting_that_overrides_it(name: ProviderName) -> None:
    cls = PROVIDERS[name]
    if not issubclass(cls, RemoteProvider):  # no vendor's API (this machine, the operator's own machines)
        assert api_url_setting(cls) is None
        return
    assert cls.settings_model is not None
    field = api_url_setting(cls)
    assert field is not None and field in cls.settings_model.model_fields
    assert (
        field in FleetSettings.model_fields and field not in Settings.model_fields
    )  # the cloud's, not core's
    assert field in cls.settings_model.AS_IS  # also read under the vendor's own variable


def test_the_api_urls_come_from_the_settings_under_the_vendors_names(tmp_path: Path) -> None:
    none = {"FLEET_SETTINGS_FILE": str(tmp_path / "absent.yml")}
    (tmp_path / "absent.yml").write_text("")
    assert api_urls(load_fleet_settings(none)) == {
        "runpod": "https://api.runpod.io",
        "vastai": "https://console.vast.ai",
    }
    env = {**none, "RUNPOD_API_BASE_URL": "http://rp.test", "FLEET_VAST_URL": "http://vast.test"}
    assert api_urls(load_fleet_settings(env)) == {"runpod": "http://rp.test", "vastai": "http://vast.test"}
    (tmp_path / "file.yml").write_text(
        "vast_url: http://file.test\nrunpod_proxy_url: https://{pod_id}.p.test\n"
    )
    from_file = load_fleet_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "file.yml")})
    assert api_urls(from_file)["vastai"] == "http://file.test"
    assert cloud_settings(from_file)["runpod"] == RunPodSettings(runpod_proxy_url="https://{pod_id}.p.test")
    settings = FleetSettings(runpod_api_base_url="http://a.test", vast_url="http://b.test")
    assert api_urls(settings) == {"runpod": "http://a.test", "vastai": "http://b.test"}
    assert api_urls(Settings()) == {"runpod": "https://api.runpod.io", "vastai": "https://console.vast.ai"}


def test_a_settings_key_no_cloud_declares_and_an_unknown_provider_are_errors(tmp_path: Path) -> None:
    (tmp_path / "file.yml").write_text("runpod_proxy_ulr: https://{pod_id}.p.test\n")
    with pytest.raises(ConfigError, match="runpod_proxy_ulr"):
        load_fleet_settings({"FLEET_SETTINGS_FILE": str(tmp_path / "file.yml")})
    none = {"FLEET_SETTINGS_FILE": str(tmp_path / "absent.yml")}
    (tmp_path / "absent.yml").write_text("")
    with pytest.raises(ConfigError, match="unknown provider 'runpd'; valid: local, runpod, vastai, ssh"):
        load_fleet_settings({**none, "FLEET_PROVIDERS": "local,runpd"})
    assert fleet_runs(load_fleet_settings(none)) == ("local", "runpod", "vastai", "ssh")  # unset: all
    assert fleet_runs(load_fleet_settings({**none, "FLEET_PROVIDERS": "runpod"})) == ("runpod",)


def test_a_provider_reads_its_url_from_the_context_else_its_default(tmp_path: Path) -> None:
    keys = dict.fromkeys(CREDENTIAL_NAMES, "k")
    context = ProviderContext(home=tmp_path, credentials={k: SecretStr(v) for k, v in keys.items()})
    assert get_provider("vastai", context).api_url == "https://console.vast.ai"  # type: ignore[attr-defined]
    moved = ProviderContext(home=tmp_path, credentials=context.credentials, urls={"runpod": "http://rp.test"})
    assert get_provider("runpod", moved).api_url == "http://rp.test"  # type: ignore[attr-defined]


def test_an_unknown_provider_s_error_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        provider_name("runpd")
    message = str(caught.value)
    assert "unknown provider 'runpd'" in message
    for name in provider_names():
        assert name.value in message


DECLARED = (
    "from jobs import clouds; from core import envnames; "
    "print(sorted(clouds.declared()), len(envnames.clouds()), envnames.refusal('RUNPOD_POD_ID') is not None)"
)


ENTRIES = ("fleet.cli", "workers.stages.provision", "bot.app", "service.runs")
BENCHES = ("bench.overhead", "bench.scale_record", "bench.scale", "bench.reap")  # they read jobs too


@pytest.mark.parametrize("module", [*ENTRIES, *BENCHES])
def test_every_process_s_entry_declares_the_clouds_to_the_layers_below(module: str) -> None:
    """The job's data and the env check learn the clouds from the registry: every process's entry imports
    it, so a job read anywhere knows every cloud's GPU names and reserved env names."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}; {DECLARED}"], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["['runpod',", "'ssh',", "'vastai']", "2", "True"], done.stdout


def test_asking_before_the_registry_declared_the_clouds_is_a_loud_error() -> None:
    """Never an empty answer that would let a cloud's reserved name or GPU through unchecked."""
    code = (
        "from jobs import clouds, gpus; from core import envnames\n"
        "asks = clouds.declared, lambda: envnames.refusal('RUNPOD_POD_ID'), lambda: gpus.resolve('A100')\n"
        "for ask in asks:\n"
        "    try:\n        ask()\n    except RuntimeError as exc:\n        print(type(exc).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["NotDeclared", "RuntimeError", "NotDeclared"], done.stdout + done.stderr
