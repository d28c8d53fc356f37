"""`make demo` runs the gateway against the simulators alone: the settings built from the variables its recipe
sets name no real upstream host, and every fal URL (queue, webhook keys, request history) is the Pika
simulator's. A URL setting added with a real host as its default fails here until the demo points it at a
simulator."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic_settings import BaseSettings

from gateway.settings import Settings, environment_variables, settings_groups

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def makefile_defaults(text: str) -> dict[str, str]:
    """The `NAME ?= value` (and `NAME := value`) lines."""
    return dict(re.findall(r"^([A-Z_]+)\s*[?:]?=\s*(\S*)\s*$", text, flags=re.MULTILINE))


def demo_environment() -> dict[str, str]:
    """The variables the demo recipe sets for `$(MAKE) ... up`, with the Makefile's defaults filled in."""
    text = MAKEFILE.read_text()
    recipe = re.search(r"^demo:.*?\n((?:\t.*\n)+)", text, flags=re.MULTILINE)
    assert recipe is not None, "the Makefile has no demo target"
    commands = recipe.group(1).replace("\\\n", " ").splitlines()
    [up] = [command for command in commands if "$(MAKE)" in command and command.rstrip().endswith(" up")]
    defaults = makefile_defaults(text)
    environment = {}
    for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*)=(\S+)", up):
        environment[name] = re.sub(r"\$\(([A-Z_]+)\)", lambda ref: defaults[ref.group(1)], value)
    return environment


def url_settings() -> dict[str, str]:
    """Every variable whose default is an http(s) URL on a host that is not this machine, with that default."""
    urls = {}
    for group in settings_groups(Settings):
        for name, field in environment_variables(group).items():
            default = field.default
            real = isinstance(default, str) and default.startswith(("http://", "https://"))
            if real and urlsplit(default).hostname not in LOOPBACK:
                urls[name] = default
    return urls


def values(settings: BaseSettings) -> dict[str, object]:
    """Each variable's value in `settings` and the groups it holds."""
    fields = {id(field): name for name, field in type(settings).model_fields.items()}
    found = {
        name: getattr(settings, fields[id(field)]) for name, field in environment_variables(type(settings)).items()
    }
    for name in fields.values():
        if isinstance(group := getattr(settings, name), BaseSettings):
            found |= values(group)
    return found


def test_the_demo_points_every_upstream_url_at_a_local_simulator(monkeypatch: pytest.MonkeyPatch) -> None:
    environment = demo_environment()
    real_hosts = url_settings()
    assert {"VIDEO_BASE_URL", "VIDEO_WEBHOOK_JWKS_URL", "VIDEO_PLATFORM_URL", "CHAT_BASE_URL"} <= set(real_hosts)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)

    built = {name: str(value) for name, value in values(Settings()).items() if name in real_hosts}
    assert set(built) == set(real_hosts)
    left_real = {name: url for name, url in built.items() if urlsplit(url).hostname not in LOOPBACK}
    assert left_real == {}, f"make demo leaves these at their real hosts: {left_real}"

    pika = urlsplit(built["VIDEO_BASE_URL"])
    fal = {name: url for name, url in built.items() if "fal." in str(urlsplit(real_hosts[name]).hostname)}
    assert set(fal) == {"VIDEO_BASE_URL", "VIDEO_WEBHOOK_JWKS_URL", "VIDEO_PLATFORM_URL"}
    assert pika.port == int(makefile_defaults(MAKEFILE.read_text())["VIDEO_SIMULATOR_PORT"])
    for name, url in fal.items():
        assert (urlsplit(url).hostname, urlsplit(url).port) == (pika.hostname, pika.port), name
