"""A `cloud:` job's pools against the fleet's real Redis, where the claims are: a machine another run holds is
left out (and says by whom), a pool whose machines are all held is one to wait for, and the launch of a
pool machine a run chose claims that machine or nothing. No machine is reached here: the sshd-backed
cases are tests/integration/test_ssh_provider.py and test_e2e_pool.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from core.errors import MachinesHeld, NoCapacity
from jobs.sections import CloudSection, ProviderName
from providers.anycloud import rank, summary
from providers.base import LaunchRequest, ProviderContext
from providers.ssh.claims import Claims
from providers.ssh.provider import SshProvider
from providers.ssh.settings import SshSettings
from tests.sshd import free_port

pytestmark = pytest.mark.integration

SSH = ProviderName("ssh")
SMALL, BIG = free_port(), free_port()
SECTION = CloudSection.model_validate({"gpu": "rtx a5000", "clouds": ["ssh:lab"], "max_bid_per_gpu": 0.5})


@pytest.fixture
def provider(tmp_path: Path, redis_client: redis.Redis[str]) -> SshProvider:
    (tmp_path / "pools.yml").write_text(  # small, big, dear: nothing listens at their ports
        "pools:\n  lab:\n    user: me\n    key: /k\n    machines:\n"
        f"      - {{host: 127.0.0.1, port: {SMALL}, gpus: 1, gpu: RTX-A5000, hourly_usd: 0.4}}\n"
        f"      - {{host: 127.0.0.1, port: {BIG}, gpus: 4, gpu: RTX-A5000, hourly_usd: 0.5}}\n"
        f"      - {{host: 127.0.0.1, port: {free_port()}, gpus: 1, gpu: RTX-A5000, hourly_usd: 0.9}}\n"
    )
    own = SshSettings(ssh_pools_file=tmp_path / "pools.yml", ssh_known_hosts=tmp_path / "none")
    return SshProvider(ProviderContext(home=tmp_path, clouds={"ssh": own}, client=redis_client))


def test_a_held_machine_is_left_out_and_a_pool_whose_machines_are_all_held_is_waited_for(
    provider: SshProvider, redis_client: redis.Redis[str]
) -> None:
    small, big, _ = provider.pools().machines("lab")
    claims = Claims(redis_client)
    assert [o.key for o in rank(SECTION, lambda _: provider).fits] == [
        f"ssh:lab/127.0.0.1:{SMALL}",
        f"ssh:lab/127.0.0.1:{BIG}",
    ]
    assert claims.claim([small], ["tf-other-1"], "other")
    choice = rank(SECTION, lambda _: provider)
    assert [o.key for o in choice.fits] == [f"ssh:lab/127.0.0.1:{BIG}"] and choice.held == ()
    why = {r.candidate.key: r.reasons for r in choice.rejected}
    assert why[f"ssh:lab/127.0.0.1:{SMALL}"] == ("held by run other",)
    assert claims.claim([big], ["tf-third-1"], "third")
    choice = rank(SECTION, lambda _: provider)
    # Nothing free within the price cap, and machines that would fit it are held: a run waits for them
    assert choice.fits == () and choice.held == ("ssh:lab",)
    assert "held by run third" in str(choice.rejected) and "above max_bid_per_gpu" in str(choice.rejected)
    # A machine over the cap that nobody holds is no reason to wait
    claims.release("lab", "tf-other-1")
    claims.release("lab", "tf-third-1")
    dear = SECTION.model_copy(update={"max_bid_per_gpu": 0.2})
    assert rank(dear, lambda _: provider).held == ()
    assert "no cloud was asked" not in summary(rank(dear, lambda _: provider))


def test_the_launch_of_a_chosen_pool_machine_claims_that_machine_or_nothing(
    provider: SshProvider, redis_client: redis.Redis[str]
) -> None:
    small = provider.pools().machines("lab")[0]
    claims = Claims(redis_client)
    assert claims.claim([small], ["tf-other-1"], "other")

    def launch(offer: str) -> None:
        section = SECTION.on(SSH, "RTX-A5000", True, offer)
        provider.launch(LaunchRequest("tf-mine-1", "mine", section, offer=offer))

    with pytest.raises(MachinesHeld, match="held by other") as held:  # taken since the run chose it: move on
        launch(f"lab/127.0.0.1:{SMALL}")
    assert held.value.made_nothing
    with pytest.raises(NoCapacity, match=r"lab/gone\.invalid: no longer a machine of the pool that fits"):
        launch("lab/gone.invalid")  # the pools file changed since
    with pytest.raises(NoCapacity, match="connection refused") as down:  # free, but it does not answer
        launch(f"lab/127.0.0.1:{BIG}")
    assert down.value.made_nothing and not isinstance(down.value, MachinesHeld)
    assert {m: c.instance for m, c in claims.held("lab").items()} == {small.name: "tf-other-1"}
