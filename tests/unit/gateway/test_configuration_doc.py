from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.settings import all_environment_variables
from gateway.settings_doc import DOCUMENT, main, render


def test_configuration_document_matches_the_settings() -> None:
    assert DOCUMENT.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md drifted from gateway/settings/: run `python -m gateway.settings_doc`"
    )


def test_every_variable_the_gateway_reads_is_documented() -> None:
    document = render()
    assert [name for name in sorted(all_environment_variables()) if f"| `{name}` |" not in document] == []


class InnerSettings(BaseSettings):
    """Inner group."""

    model_config = SettingsConfigDict(env_prefix="OUTER_INNER_")

    limit: float = Field(2.0, description="A | piped\n  description.")


class OuterSettings(BaseSettings):
    """Outer group."""

    model_config = SettingsConfigDict(env_prefix="OUTER_")

    key: SecretStr | None = Field(None, description="A secret.")
    name: str = Field("", validation_alias="SOME_ALIAS", description="Aliased.")
    inner: InnerSettings = Field(default_factory=InnerSettings)


class RootSettings(BaseSettings):
    outer: OuterSettings = Field(default_factory=OuterSettings)


def test_sections_recurse_into_nested_groups_with_names_defaults_and_descriptions() -> None:
    document = render(RootSettings)
    assert "## `settings.outer` (OuterSettings)\n\nOuter group.\n" in document
    assert "## `settings.outer.inner` (InnerSettings)\n\nInner group.\n" in document
    assert "| `OUTER_KEY` | unset | A secret. |" in document
    assert "| `SOME_ALIAS` | empty | Aliased. |" in document
    assert "| `OUTER_INNER_LIMIT` | `2` | A \\| piped description. |" in document
    assert document.index("settings.outer`") < document.index("settings.outer.inner`")


def test_check_fails_on_a_stale_document_and_passes_on_a_fresh_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = tmp_path / "configuration.md"
    document.write_text(render() + "stale\n", encoding="utf-8")
    assert main(["--check", "--output", str(document)]) == 1
    assert "out of date" in capsys.readouterr().err

    assert main(["--output", str(document)]) == 0
    assert main(["--check", "--output", str(document)]) == 0
