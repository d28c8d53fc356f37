"""`CHAT_*` and `VIDEO_*` were `HUNYUAN_*` and `PIKA_*` before 0.2: the old names are still read, below the new ones,
and each one set is logged once at start-up, by name only."""

from __future__ import annotations

import logging

import pytest

from gateway.app import create_app
from gateway.settings import Settings, deprecated_variables, renamed_variables
from tests.helpers.running_gateway import gateway_settings

OLD = {
    "HUNYUAN_API_KEY": "sk-old-secret-value",
    "HUNYUAN_MAX_CONCURRENT": "7",  # the quota, a group inside the chat group
    "HUNYUAN_MODELS": "old-model",
    "PIKA_MODEL_PATH": "fal-ai/some/other-model",
}


@pytest.fixture
def old_names(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in OLD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CHAT_MODELS", "new-model")


@pytest.mark.usefixtures("old_names")
def test_old_names_are_read_and_the_new_name_wins() -> None:
    settings = Settings()
    assert settings.chat.api_key is not None and settings.chat.api_key.get_secret_value() == OLD["HUNYUAN_API_KEY"]
    assert settings.chat.quota.max_concurrent == 7
    assert settings.chat.models == "new-model"
    assert settings.video.model_path == "fal-ai/some/other-model"


def test_every_renamed_variable_maps_onto_one_the_gateway_reads() -> None:
    renamed = renamed_variables()
    assert all(old.startswith(("HUNYUAN_", "PIKA_")) for old in renamed)
    assert renamed["HUNYUAN_REQUESTS_PER_SECOND"] == "CHAT_REQUESTS_PER_SECOND"
    assert renamed["PIKA_CALLBACK_GRACE_SECONDS"] == "VIDEO_CALLBACK_GRACE_SECONDS"
    assert "CHAT_CACHE_MB" not in renamed.values(), "the answer cache's variables were never HUNYUAN_*"
    assert deprecated_variables(renamed, {"PIKA_API_KEY": "x", "CHAT_API_KEY": "y"}) == {
        "PIKA_API_KEY": "VIDEO_API_KEY"
    }


@pytest.mark.usefixtures("old_names")
def test_each_old_name_is_logged_once_at_start_without_its_value(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.app"):
        create_app(gateway_settings("127.0.0.1:9"))
    deprecated = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert sorted(deprecated) == sorted(
        f"{old} is deprecated and will not be read after this release: set {new} instead"
        for old, new in renamed_variables().items()
        if old in OLD
    )
    assert not any(OLD["HUNYUAN_API_KEY"] in r.getMessage() for r in caplog.records)
