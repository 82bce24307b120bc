"""The nodes' tokens sealed in the fleet's Redis (providers.sealed): what lets a worker on another machine,
with a home of its own, reach a node this one made, and what Redis (or a dump of it) shows of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from cryptography.fernet import Fernet
from pydantic import SecretStr

from core.errors import ConfigError, SealMismatch
from core.settings import Settings
from providers.sealed import KEY_FILE, SEAL_KEY, FileStore, SealedStore, seal_key
from providers.tokens import NodeTokens
from providers.world import World
from state.keys import NODE_SECRETS


def tokens_of(client: redis.Redis[str], home: Path, key: bytes) -> NodeTokens:
    legacy = FileStore(home / "secrets" / "nodes")
    return NodeTokens(home, SealedStore(client, key, legacy, SEAL_KEY))


def test_a_token_made_on_one_machine_is_read_on_another_and_redis_holds_it_sealed(
    redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    key = Fernet.generate_key()
    here, there = tokens_of(redis_client, tmp_path / "a", key), tokens_of(redis_client, tmp_path / "b", key)
    token = here.ensure("tf-r1-1-0")
    jupyter = here.ensure_jupyter("tf-r1-1-0")
    cert, _key = here.ensure_tls("tf-r1-1-0")
    assert here.ensure("tf-r1-1-0") == token  # a relaunch reuses it
    assert there.get("tf-r1-1-0") == token and there.jupyter("tf-r1-1-0") == jupyter
    pin = there.tls_pin("tf-r1-1-0")  # the pinned certificate, written into the other machine's home
    assert pin is not None and pin.read_text() == cert and pin.is_relative_to(tmp_path / "b")
    assert pin.stat().st_mode & 0o077 == 0
    assert there.join("tf-r1-1-1", head="tf-r1-1-0") == token
    assert here.head_of("tf-r1-1-1") == "tf-r1-1-0"

    stored = redis_client.hgetall(NODE_SECRETS)
    assert set(stored) == {
        f"tf-r1-1-{n}{s}" for n, s in [(0, ""), (0, ".jupyter"), (0, ".crt"), (0, ".key")]
    } | {
        "tf-r1-1-1",
        "tf-r1-1-1.head",
    }
    dump = "\n".join(stored.values())
    assert token not in dump and jupyter not in dump and "BEGIN" not in dump and "tf-r1-1-0" not in dump
    assert not (tmp_path / "a" / "secrets" / "nodes").exists()  # nothing in the home that made them

    there.forget("tf-r1-1-0")
    there.forget("tf-r1-1-1")
    assert redis_client.hlen(NODE_SECRETS) == 0 and here.get("tf-r1-1-0") is None
    assert not pin.exists()


def test_another_seal_key_is_refused_by_name_never_read_as_a_wrong_token(
    redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    tokens_of(redis_client, tmp_path / "a", Fernet.generate_key()).ensure("tf-r2-1-0")
    other = tokens_of(redis_client, tmp_path / "b", Fernet.generate_key())
    with pytest.raises(SealMismatch, match=f"another seal key.*same {SEAL_KEY}") as refused:
        other.get("tf-r2-1-0")
    assert refused.value.failure is not None  # the run fails as AUTH_FAILED, not retried


def test_a_node_made_before_the_fleet_sealed_its_tokens_is_still_reached(
    redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    old = NodeTokens(tmp_path / "a")  # files under the home, as before
    token = old.ensure("tf-r3-1-0")
    now = tokens_of(redis_client, tmp_path / "a", Fernet.generate_key())
    assert now.get("tf-r3-1-0") == token
    now.forget("tf-r3-1-0")
    assert old.get("tf-r3-1-0") is None


def test_the_seal_key_is_the_configured_one_else_made_once_in_the_home(tmp_path: Path) -> None:
    made, source = seal_key(None, tmp_path)
    assert source == str(tmp_path / "secrets" / KEY_FILE)
    assert (tmp_path / "secrets" / KEY_FILE).stat().st_mode & 0o077 == 0
    assert seal_key(None, tmp_path) == (made, source)  # kept, not made again
    given = Fernet.generate_key()
    assert seal_key(given.decode(), tmp_path) == (given, SEAL_KEY)
    with pytest.raises(ConfigError, match=SEAL_KEY):
        seal_key("not-a-key", tmp_path)


def test_a_configured_seal_key_that_is_none_is_a_config_error_naming_it(
    redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    from core.secrets import Secrets

    secrets = Secrets({SEAL_KEY: SecretStr("hunter2")}, tmp_path / "secrets.yml")
    with pytest.raises(ConfigError, match=SEAL_KEY) as refused:
        _ = World.of(Settings(home=tmp_path), secrets).sharing(redis_client).context
    assert "hunter2" not in str(refused.value)


def test_a_secret_opened_once_is_still_read_from_redis_each_time(
    redis_client: redis.Redis[str], tmp_path: Path
) -> None:
    """Each process opens a sealed value once; Redis is asked every time, so a new value or a drop is seen."""
    store = SealedStore(redis_client, Fernet.generate_key(), FileStore(tmp_path / "nodes"), SEAL_KEY)
    store.put("tf-r1-1-0", "first")
    assert store.get("tf-r1-1-0") == "first" and store.get("tf-r1-1-0") == "first"
    store.put("tf-r1-1-0", "second")  # sealed anew: another value in Redis
    assert store.get("tf-r1-1-0") == "second"
    store.drop(["tf-r1-1-0"])
    assert store.get("tf-r1-1-0") is None
