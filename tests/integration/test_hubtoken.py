"""service.hubtoken against the Hub fake: what the Hub's whoami-v2 says about a token decides whether a
job that pushes is taken (every kind of token the Hub has), and a Hub that cannot be asked refuses nothing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from service.hubtoken import push_refusal
from tests.fakes.hub import FakeHub

pytestmark = pytest.mark.integration
TOKEN = "hf-tester-write"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    with FakeHub(home=tmp_path / "hub", token=TOKEN) as hub:
        hub.orgs.append("lab")
        hub.add_token("hf-read", role="read")
        hub.add_token("hf-team", namespaces=["team"])
        yield hub


@pytest.mark.parametrize(
    ("token", "repo_id", "said"),
    [
        (TOKEN, "tester/tiny", None),
        (TOKEN, "lab/tiny", None),  # the user's organization
        (TOKEN, "someone/tiny", "HF_TOKEN is tester's (orgs: lab): it cannot create or write someone/tiny"),
        ("hf-read", "tester/tiny", "HF_TOKEN is a read token; pushing to tester/tiny needs a write token"),
        ("hf-team", "team/tiny", None),
        ("hf-team", "tester/tiny", "a fine-grained token without write access to tester"),
        ("hf-wrong", "tester/tiny", "the Hub does not accept HF_TOKEN"),
    ],
)
def test_the_hub_says_whether_the_token_may_push_there(
    hub: FakeHub, token: str, repo_id: str, said: str | None
) -> None:
    got = push_refusal(hub.url, SecretStr(token), repo_id)
    assert (got is None) if said is None else (got is not None and said in got), got
    assert got is None or token not in got


def test_a_hub_that_cannot_be_asked_refuses_nothing() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert push_refusal(f"http://127.0.0.1:{port}", SecretStr(TOKEN), "someone/tiny", timeout_s=2) is None
