"""A private image (`private_image: true`) is pulled with the fleet's login for its registry: RunPod's
container registry auth on the account (runpod_registry_auths names its id), vast.ai's docker login
(VAST_REGISTRY_LOGINS), through the adapters against the fakes, whose registries pull a private image only
with its own login (tests.fakes.node_images.PullLogin) and answer anything else as docker's daemon does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from core.errors import ProviderError, ProvisioningFailed
from jobs.sections import CloudSection
from providers.anycloud import rank
from providers.base import LaunchRequest, ProviderContext
from providers.runpod.provider import RunPodProvider
from providers.runpod.section import RunPodSection
from providers.runpod.settings import RunPodSettings
from providers.vastai.provider import VastAIProvider
from providers.vastai.section import VastAISection
from tests.fakes.node_images import PullLogin
from tests.fakes.runpod import FakeRunPod
from tests.fakes.vastai import FakeVastAI
from tests.integration.test_runpod_provider import KEY as RUNPOD_KEY
from tests.integration.test_vastai_provider import KEY as VAST_KEY

pytestmark = pytest.mark.integration

IMAGE = "ghcr.io/acme/trainer:1"
BOT = PullLogin("ghcr.io", "acme-bot", "ghp_pulltoken0123456789")
ANY_HOST = {"gpu": "RTX_A5000", "cloud_type": "ALL", "max_bid_per_gpu": 0.5}  # the fake's offers fit it


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[FakeRunPod]:
    with FakeRunPod(api_key=RUNPOD_KEY, home=tmp_path / "rp", nodes="none", ready_delay_s=0.1) as fake:
        fake.images.register_private(IMAGE, BOT)
        yield fake


@pytest.fixture
def vast(tmp_path: Path) -> Iterator[FakeVastAI]:
    with FakeVastAI(api_key=VAST_KEY, home=tmp_path / "va", nodes="none", ready_delay_s=0.1) as fake:
        fake.images.register_private(IMAGE, BOT)
        yield fake


def on_runpod(fake: FakeRunPod, tmp_path: Path, auths: dict[str, str]) -> RunPodProvider:
    own = RunPodSettings(**fake.proxy.values(), runpod_registry_auths=auths)
    credentials = {"RUNPOD_API_KEY": SecretStr(RUNPOD_KEY)}
    urls, clouds = {"runpod": fake.url}, {"runpod": own}
    return RunPodProvider(ProviderContext(home=tmp_path, credentials=credentials, urls=urls, clouds=clouds))


def on_vast(fake: FakeVastAI, tmp_path: Path, logins: str | None) -> VastAIProvider:
    credentials = {"VAST_API_KEY": SecretStr(VAST_KEY)}
    if logins is not None:
        credentials["VAST_REGISTRY_LOGINS"] = SecretStr(logins)
    return VastAIProvider(ProviderContext(home=tmp_path, credentials=credentials, urls={"vastai": fake.url}))


def pull_error(fake: FakeRunPod | FakeVastAI) -> object:
    (inst,) = fake.instances.values()
    return inst.extra.get("pull_error")


def test_a_runpod_pod_of_a_private_image_is_created_with_the_accounts_auth_and_pulls_it(
    runpod: FakeRunPod, tmp_path: Path
) -> None:
    auth = runpod.add_registry_auth(BOT.user, BOT.token)
    provider = on_runpod(runpod, tmp_path, {"ghcr.io": auth})
    section = RunPodSection(image=IMAGE, private_image=True)
    assert provider.refusal(section) is None
    provider.launch(LaunchRequest("tf-p1-1", "p1", section))
    (inst,) = runpod.instances.values()
    assert inst.extra["containerRegistryAuthId"] == auth and pull_error(runpod) is None


def test_without_private_image_or_with_a_stale_auth_the_pull_fails_as_dockers_does(
    runpod: FakeRunPod, tmp_path: Path
) -> None:
    """What the fake's registry holds against a pod: the same image pulled anonymously is denied, and an
    auth whose token the registry no longer takes is refused, in docker's words."""
    stale = runpod.add_registry_auth(BOT.user, "ghp_revoked")
    provider = on_runpod(runpod, tmp_path, {"ghcr.io": stale})
    provider.launch(LaunchRequest("tf-p1-1", "p1", RunPodSection(image=IMAGE)))
    assert "containerRegistryAuthId" not in runpod.instances[next(iter(runpod.instances))].extra
    assert "pull access denied for ghcr.io/acme/trainer" in str(pull_error(runpod))
    provider.terminate("tf-p1-1")
    runpod.instances.clear()
    provider.launch(LaunchRequest("tf-p2-1", "p2", RunPodSection(image=IMAGE, private_image=True)))
    refused = 'Get "https://ghcr.io/v2/": unauthorized: incorrect username or password'
    assert refused in str(pull_error(runpod))


def test_a_runpod_job_whose_registry_has_no_auth_rents_nothing(runpod: FakeRunPod, tmp_path: Path) -> None:
    other = runpod.add_registry_auth("someone", "tok")
    provider = on_runpod(runpod, tmp_path, {"registry.gitlab.com": other})
    section = RunPodSection(image=IMAGE, private_image=True)
    refusal = provider.refusal(section)
    assert refusal is not None and refusal.key == "private_image"
    assert "no RunPod login for ghcr.io" in refusal.why and "runpod_registry_auths" in refusal.why
    with pytest.raises(ProvisioningFailed, match=r"private_image: image ghcr\.io/acme/trainer:1 is private"):
        provider.launch(LaunchRequest("tf-p1-1", "p1", section))
    assert runpod.state()["requests"].get("create") is None and not runpod.instances
    # An id the account has not got (deleted on RunPod since): RunPod refuses the create, nothing is made.
    gone = on_runpod(runpod, tmp_path, {"ghcr.io": "crdeleted0"})
    with pytest.raises(ProviderError, match="container registry auth crdeleted0"):
        gone.launch(LaunchRequest("tf-p2-1", "p2", section))
    assert not [i for i in runpod.instances.values() if i.state != "terminated"]


def test_a_vast_instance_of_a_private_image_logs_in_on_its_host(vast: FakeVastAI, tmp_path: Path) -> None:
    provider = on_vast(vast, tmp_path, '{"GHCR.io": "acme-bot:ghp_pulltoken0123456789"}')
    section = VastAISection(**ANY_HOST, image=IMAGE, private_image=True)
    provider.launch(LaunchRequest("tf-v1-1", "v1", section))
    assert pull_error(vast) is None
    shown = repr(provider.list_instances()) + repr(provider.get("tf-v1-1"))
    assert BOT.token not in shown  # the login goes to the host that pulls, never back into the fleet's view


def test_a_vast_login_for_another_registry_or_none_refuses_the_job(vast: FakeVastAI, tmp_path: Path) -> None:
    section = VastAISection(**ANY_HOST, image=IMAGE, private_image=True)
    elsewhere = on_vast(vast, tmp_path, '{"docker.io": "acme-bot:dckr_pat_0123"}')
    for provider in (elsewhere, on_vast(vast, tmp_path, None)):
        refusal = provider.refusal(section)
        assert refusal is not None and "no vast.ai login for ghcr.io" in refusal.why, refusal
        assert "VAST_REGISTRY_LOGINS" in refusal.why
    malformed = on_vast(vast, tmp_path, '{"ghcr.io": "ghp_pulltoken0123456789"}')  # no user
    refusal = malformed.refusal(section)
    assert refusal is not None and "ghcr.io's login must be user:token" in refusal.why
    assert "ghp_pulltoken" not in refusal.why
    with pytest.raises(ProvisioningFailed):
        malformed.launch(LaunchRequest("tf-v1-1", "v1", section))
    assert not vast.instances
    # A public image needs no login, whatever the secret holds.
    malformed.launch(LaunchRequest("tf-v2-1", "v2", VastAISection(**ANY_HOST)))
    assert pull_error(vast) is None


def test_a_cloud_job_of_a_private_image_asks_only_the_clouds_with_its_login(
    runpod: FakeRunPod, vast: FakeVastAI, tmp_path: Path
) -> None:
    providers = {
        "runpod": on_runpod(runpod, tmp_path, {}),
        "vastai": on_vast(vast, tmp_path, '{"ghcr.io": "acme-bot:ghp_pulltoken0123456789"}'),
    }
    section = CloudSection(gpu=("RTX-A5000",), cloud_type="ALL", image=IMAGE, private_image=True)
    choice = rank(section, lambda cloud: providers[cloud.value])
    assert {o.priced.candidate.provider.value for o in choice.fits} == {"vastai"}
    (unasked,) = choice.unasked
    assert unasked[0].value == "runpod" and "no RunPod login for ghcr.io" in unasked[1]
