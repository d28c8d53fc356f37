"""Settings groups whose variables were renamed: the old prefix is still read, below the new one, for one release.

`CHAT_*` was `HUNYUAN_*` and `VIDEO_*` was `PIKA_*` until 0.4. A deployment that still sets an old name keeps
working; the gateway logs each one once at start-up (`deprecated_variables`) and the README's migration table
lists them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import ClassVar

from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource


class RenamedPrefix:
    """Mixed into a `BaseSettings` group: its variables are also read under `deprecated_prefix`."""

    deprecated_prefix: ClassVar[str]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        deprecated = EnvSettingsSource(settings_cls, env_prefix=cls.deprecated_prefix)
        return init_settings, env_settings, deprecated, dotenv_settings, file_secret_settings

    @classmethod
    def renamed_variables(cls, names: list[str]) -> dict[str, str]:
        """Old name -> new name for each of this group's variables `names` (under the group's own prefix)."""
        prefix = str(getattr(cls, "model_config", {}).get("env_prefix", ""))
        return {cls.deprecated_prefix + name.removeprefix(prefix): name for name in names if name.startswith(prefix)}


def deprecated_variables(renamed: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The old names in `renamed` (old -> new) that the environment still sets, with their new names."""
    present = {name.upper() for name in (os.environ if environ is None else environ)}
    return {old: new for old, new in renamed.items() if old in present}
