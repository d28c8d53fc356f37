"""The gateway's imports drawn as layers (docs/architecture.md, "The gateway's layers"): no package imports one
above it, no two packages import each other (even through others), and the services know no web framework."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"
TRANSPORTS = {"routes", "grpc"}
COMPOSITION = {"wiring", "app", "__main__", "openapi"}
STORAGE = {"upstreams", "search", "tasks", "cache", "quota"}  # what the services use and the transports never see

# package -> the packages above it, which it must not import
ABOVE: dict[str, set[str]] = {
    "settings": {"errors", "keys", "usage", "services", "billing", *STORAGE, *TRANSPORTS, *COMPOSITION},
    "keys": {"usage", "services", "billing", *TRANSPORTS, *COMPOSITION},
    "usage": {"services", "billing", *TRANSPORTS, *COMPOSITION},
    "services": {"billing", *TRANSPORTS, *COMPOSITION},
    "billing": {*TRANSPORTS, *COMPOSITION},
    "gpu": {"services", "billing", "keys", "usage", *TRANSPORTS, *COMPOSITION},  # the services consult the GPU policy
    "routes": {*STORAGE, *COMPOSITION},
    "grpc": {*STORAGE, *COMPOSITION},
    **{package: {"services", "billing", "keys", "usage", *TRANSPORTS, *COMPOSITION} for package in STORAGE},
}


def modules() -> Iterator[tuple[str, ast.Module]]:
    """(top-level package or module, parsed source) of every module but the generated protobuf code."""
    for path in GATEWAY.rglob("*.py"):
        if "pb" not in path.relative_to(GATEWAY).parts:
            yield path.relative_to(GATEWAY).parts[0].removesuffix(".py"), ast.parse(path.read_text(encoding="utf-8"))


def imported(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


@cache
def package_imports() -> dict[str, frozenset[str]]:
    """Each top-level package or module of `gateway` -> the others it imports."""
    found: dict[str, set[str]] = {}
    for package, tree in modules():
        targets = {name.split(".")[1] for name in imported(tree) if name.startswith("gateway.")}
        found.setdefault(package, set()).update(targets - {package})
    return {package: frozenset(targets) for package, targets in found.items()}


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_no_package_imports_one_above_it(package: str) -> None:
    assert package_imports()[package] & ABOVE[package] == set()


def test_no_two_packages_import_each_other() -> None:
    graph = package_imports()

    def reachable(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for target in graph.get(stack.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return seen

    cycles = [(a, b) for a in graph for b in graph[a] if a in reachable(b)]
    assert cycles == []


def test_the_services_know_no_web_framework() -> None:
    frameworks = ("fastapi", "starlette", "grpc")
    found = {
        name
        for package, tree in modules()
        if package in {"services", "billing", "keys", "usage", *STORAGE}
        for name in imported(tree)
        if name.split(".")[0] in frameworks
    }
    assert found == set()
