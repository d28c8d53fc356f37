"""Watch tokens: minted for a task and a key, refused when forged, stale, malformed or unsigned; the key they name is
looked up as it is when a socket opens."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from pydantic import SecretStr

from gateway.errors import AuthenticationError, PermissionDeniedError
from gateway.keys.gatekeeper import Gatekeeper
from gateway.keys.limiter import LocalKeyLimiter
from gateway.keys.model import ApiKey
from gateway.keys.resolver import ANONYMOUS, KeyResolver, env_keys
from gateway.keys.watch_tokens import WatchTokenError, WatchTokens, WatchTokensNotConfiguredError

KEY = ApiKey(id="key_0123456789abcdef", secret_hash="", prefix="sk-…abcd", name="web", team="default")
TASK = "task_" + "a" * 32
# RFC 7230's token characters: what a Sec-WebSocket-Protocol value may hold.
SUBPROTOCOL_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def tokens(secret: str | None = "s3cret", clock: Clock | None = None, lifetime: float = 300.0) -> WatchTokens:
    return WatchTokens(SecretStr(secret) if secret is not None else None, lifetime, clock or Clock())


def test_a_token_names_its_task_and_key_until_it_expires() -> None:
    clock = Clock()
    signer = tokens(clock=clock)
    minted = signer.mint(TASK, KEY)
    assert minted.task_id == TASK and minted.expires_at == int(clock.now + 300)
    assert SUBPROTOCOL_TOKEN.match("token." + minted.token) and minted.token.startswith("wt1.")
    claims = signer.verify(minted.token)
    assert (claims.task_id, claims.key_id, claims.expires_at) == (TASK, KEY.id, minted.expires_at)
    assert tokens(clock=clock).verify(minted.token) == claims  # another replica with the same secret
    clock.now = minted.expires_at
    with pytest.raises(WatchTokenError, match="expired"):
        signer.verify(minted.token)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda token: token[:-2] + ("AA" if not token.endswith("AA") else "BB"),  # signature
        lambda token: "wt1." + "dGFza18x" + token[token.index(".", 4) :],  # claims swapped for another task's
        lambda token: "wt2" + token[3:],
        lambda token: token.split(".")[0],
        lambda token: "",
        lambda token: "wt1..",
        lambda token: token + "\u00e9",
    ],
)
def test_a_changed_token_is_refused_without_quoting_it(mangle: object) -> None:
    minted = tokens().mint(TASK, KEY).token
    changed = mangle(minted)  # type: ignore[operator]
    with pytest.raises(WatchTokenError) as refused:
        tokens().verify(changed)
    assert all(part not in str(refused.value) for part in minted.split(".")[1:])  # never quoted, even in part
    assert refused.value.status_code == 401 and refused.value.code == "invalid_watch_token"


def test_a_token_signed_with_another_secret_is_refused() -> None:
    with pytest.raises(WatchTokenError, match="not signed by this gateway"):
        tokens("other").verify(tokens().mint(TASK, KEY).token)


def test_the_gateways_own_secret_wins_over_the_video_key() -> None:
    own, video = SecretStr("own"), SecretStr("fal-key")
    minted = WatchTokens.from_secrets(own, video, 60).mint(TASK, KEY).token
    WatchTokens.from_secrets(own, None, 60).verify(minted)
    with pytest.raises(WatchTokenError):
        WatchTokens.from_secrets(None, video, 60).verify(minted)
    fallback = WatchTokens.from_secrets(SecretStr(""), video, 60).mint(TASK, KEY).token  # empty: unset (Helm's "")
    WatchTokens.from_secrets(None, video, 60).verify(fallback)


def test_without_any_secret_tokens_are_neither_minted_nor_accepted() -> None:
    unsigned = tokens(None)
    with pytest.raises(WatchTokensNotConfiguredError) as refused:
        unsigned.mint(TASK, KEY)
    assert refused.value.status_code == 503 and "GATEWAY_WATCH_TOKEN_SECRET" in refused.value.message
    with pytest.raises(WatchTokensNotConfiguredError):
        unsigned.verify(tokens().mint(TASK, KEY).token)


def test_a_tokens_key_is_looked_up_as_it_is_now() -> None:
    [video_key] = env_keys([b"sk-a-video-key-of-the-gateway"])
    search_only = replace(video_key, id="key_search", secret_hash="other", scopes=frozenset({"search"}))
    revoked = replace(video_key, id="key_revoked", secret_hash="gone", revoked_at=1.0)
    gatekeeper = Gatekeeper(KeyResolver([video_key, search_only, revoked]), LocalKeyLimiter())
    assert gatekeeper.authenticate_id(video_key.id, "video") is video_key
    with pytest.raises(AuthenticationError, match="no longer exists"):
        gatekeeper.authenticate_id("key_deleted", "video")
    with pytest.raises(AuthenticationError, match="revoked"):
        gatekeeper.authenticate_id("key_revoked", "video")
    with pytest.raises(PermissionDeniedError, match="lacks the scope 'video'"):
        gatekeeper.authenticate_id("key_search", "video")
    assert Gatekeeper(KeyResolver([]), LocalKeyLimiter()).authenticate_id("anonymous", "video") is ANONYMOUS
