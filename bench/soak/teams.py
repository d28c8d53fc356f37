"""The soak's tenants: five teams, each with its own key and limits (one permanently over its limits), and the
operator's admin key that reads the usage record and the key list. Written as the gateway's keys file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ADMIN_KEY = "sk-soak-admin-0000000000000000"


@dataclass(frozen=True)
class Team:
    name: str
    key: str
    limits: dict[str, Any] = field(default_factory=dict)
    over_limit: bool = False  # its limits are far below its share of the load: most of its requests get 429
    weight: float = 1.0  # its share of the traffic


def default_teams() -> list[Team]:
    roomy = {"requests_per_minute": 1_000_000, "concurrent_chat_streams": 500, "videos_per_day": 1_000_000}
    return [
        Team("search", "sk-soak-search-1111111111111111", roomy, weight=1.5),
        Team("assistant", "sk-soak-assistant-22222222222222", roomy, weight=1.5),
        Team("studio", "sk-soak-studio-333333333333333333", roomy),
        Team("platform", "sk-soak-platform-4444444444444444", roomy),
        Team(
            "trial",
            "sk-soak-trial-55555555555555555555",
            {"requests_per_minute": 6, "concurrent_chat_streams": 1, "videos_per_day": 1},
            over_limit=True,
            weight=0.5,
        ),
    ]


def keys_file(teams: list[Team]) -> str:
    """GATEWAY_KEYS_FILE's YAML (JSON is YAML): the teams' limits, one key per team, and the admin key."""
    document = {
        "teams": {team.name: {"limits": team.limits} for team in teams},
        "keys": [{"name": f"{team.name}-key", "team": team.name, "secret": team.key} for team in teams]
        + [
            {
                "name": "soak-operator",
                "team": "operations",
                "secret": ADMIN_KEY,
                "scopes": ["embeddings", "chat", "video", "search", "admin"],
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"
