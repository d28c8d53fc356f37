"""Configuration from the environment: one settings class per concern, grouped in modules by area (`serving`,
`gpu`, `accounts`, `stores`, `upstreams`), and `Settings`, which holds them all.

No other module reads `os.environ`. Every field states its unit and trade-off;
the Helm chart's values map 1:1 to these variables.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.settings.accounts import AuthSettings, LimitSettings, ModelPrice, UsageSettings
from gateway.settings.gpu import GpuSettings
from gateway.settings.renamed import RenamedPrefix, deprecated_variables
from gateway.settings.serving import ObservabilitySettings, ServerSettings, TritonSettings
from gateway.settings.stores import CacheSettings, RedisSettings, SearchSettings, TaskStoreSettings
from gateway.settings.upstreams import ChatQuotaSettings, ChatSettings, SemanticCacheSettings, VideoSettings

__all__ = [
    "AuthSettings",
    "CacheSettings",
    "ChatQuotaSettings",
    "ChatSettings",
    "GpuSettings",
    "LimitSettings",
    "ModelPrice",
    "ObservabilitySettings",
    "RedisSettings",
    "RenamedPrefix",
    "SearchSettings",
    "SemanticCacheSettings",
    "ServerSettings",
    "Settings",
    "TaskStoreSettings",
    "TritonSettings",
    "UsageSettings",
    "VideoSettings",
    "all_environment_variables",
    "deprecated_variables",
    "environment_variables",
    "renamed_variables",
    "settings_groups",
]


class Settings(BaseSettings):
    """Everything the gateway reads from its environment."""

    model_config = SettingsConfigDict(frozen=True)

    server: ServerSettings = Field(default_factory=ServerSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    gpu: GpuSettings = Field(default_factory=GpuSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    usage: UsageSettings = Field(default_factory=UsageSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    chat: ChatSettings = Field(default_factory=ChatSettings)
    semantic: SemanticCacheSettings = Field(default_factory=SemanticCacheSettings)
    video: VideoSettings = Field(default_factory=VideoSettings)
    tasks: TaskStoreSettings = Field(default_factory=TaskStoreSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)


def settings_groups(root: type[BaseSettings] = Settings) -> Iterator[type[BaseSettings]]:
    """Every settings class `root` is made of, depth first (a group may hold groups, e.g. the chat quota)."""
    for field in root.model_fields.values():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseSettings):
            yield group
            yield from settings_groups(group)


def environment_variables(group: type[BaseSettings]) -> dict[str, FieldInfo]:
    """The variables `group` reads itself (its own fields, not its groups'), by name: env_prefix + field name, or
    the field's validation_alias."""
    prefix = str(group.model_config.get("env_prefix", ""))
    variables: dict[str, FieldInfo] = {}
    for name, field in group.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
            continue
        alias = field.validation_alias
        variables[alias.upper() if isinstance(alias, str) else f"{prefix}{name}".upper()] = field
    return variables


def all_environment_variables() -> set[str]:
    """Every variable the gateway reads."""
    return {name for group in settings_groups() for name in environment_variables(group)}


def renamed_variables() -> dict[str, str]:
    """Every deprecated variable name the gateway still reads, with the name that replaced it."""
    renamed: dict[str, str] = {}
    for group in settings_groups():
        if issubclass(group, RenamedPrefix):
            renamed |= group.renamed_variables(list(environment_variables(group)))
    return renamed
