"""The keys file: what a valid file gives, and how an invalid one is refused without quoting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import AuthenticationError
from gateway.keys.keys_file import KeysFileError, parse_keys_file
from gateway.keys.model import ALL_SCOPES, display_prefix, hash_secret, key_id_for
from gateway.keys.resolver import ANONYMOUS, KeyResolver

SECRET = "sk-unit-test-secret-abcd"


def test_a_valid_file_gives_keys_with_hashed_secrets_and_team_limits() -> None:
    parsed = parse_keys_file(
        "teams:\n  search: {limits: {requests_per_minute: {chat: 60}, monthly_budget: {tokens: 1000}}}\n"
        "keys:\n"
        f"  - {{name: a, team: search, secret: {SECRET}, scopes: [chat], expires_at: 2030-01-01T00:00:00Z}}\n"
        f"  - {{name: b, team: ops, secret_sha256: {hash_secret('other')}, id: key_b}}\n"
    )
    first, second = parsed.keys
    assert first.secret_hash == hash_secret(SECRET) and SECRET not in repr(first)
    assert first.id == key_id_for(first.secret_hash) and first.prefix == display_prefix(SECRET) == "sk-…abcd"
    assert first.scopes == {"chat"} and first.expires_at == 1893456000.0
    assert second.id == "key_b" and second.scopes == ALL_SCOPES
    limits = parsed.teams["search"]
    assert limits.rpm_for("chat") == 60 and limits.rpm_for("embeddings") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"keys: [{{name: a, team: t, secret: {SECRET}", "not valid YAML at line 1"),
        ("- just a list", "expected a mapping"),
        ("keys:\n  - {name: a, secret: x}", "needs a 'name' and a 'team'"),
        (f"keys:\n  - {{name: a, team: t, secret: {SECRET}, secret_sha256: {'0' * 64}}}", "exactly one of"),
        ("keys:\n  - {name: a, team: t, secret_sha256: abc}", "64 hex digits"),
        (f"keys:\n  - {{name: a, team: t, secret: {SECRET}, scopes: [root]}}", "unknown scopes ['root']"),
        (f"keys:\n  - {{name: a, team: t, secret: {SECRET}, limits: {{videos_per_day: -1}}}}", "videos_per_day"),
        (f"keys:\n  - {{name: a, team: t, secret: {SECRET}, expires_at: soon}}", "ISO 8601"),
        ("teams:\n  t: {limits: {requests_per_minute: {chats: 5}}}", "unknown route families ['chats']"),
        ("teams:\n  t: {limits: {requests_per_minute: 0}}", "must be positive"),
    ],
)
def test_an_invalid_file_is_refused_with_a_reason_that_never_quotes_a_secret(text: str, message: str) -> None:
    with pytest.raises(KeysFileError) as refused:
        parse_keys_file(text)
    assert message in str(refused.value)
    assert SECRET not in str(refused.value)


async def test_a_keys_file_that_does_not_load_at_start_closes_the_gateway(tmp_path: Path) -> None:
    broken = tmp_path / "keys.yaml"
    broken.write_text("keys: [")
    resolver = KeyResolver([], keys_file=str(broken))
    await resolver.refresh()
    with pytest.raises(AuthenticationError, match="invalid API key"):
        resolver.resolve(f"Bearer {SECRET}")
    assert KeyResolver([]).resolve(None) is ANONYMOUS  # no keys anywhere: open, as documented...
    assert "admin" not in ANONYMOUS.scopes  # ...but for the admin API: nobody mints keys on an open gateway
