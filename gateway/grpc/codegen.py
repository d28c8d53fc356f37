"""Generate the gRPC Python code from `proto/` into `pb/` (`make proto`; the output is not committed).

`proto/gateway/v1/gateway.proto` becomes `pb/gateway/v1/gateway_pb2.py` (+ `.pyi`) and `gateway_pb2_grpc.py`,
importable as `gateway.grpc.pb.gateway.v1`. protoc writes imports relative to its include root
(`from gateway.v1 import ...`), which would resolve to the top-level `gateway` package, so they are rewritten.
"""

from __future__ import annotations

import re
import shutil
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_ROOT = PACKAGE_DIR / "proto"
PB_ROOT = PACKAGE_DIR / "pb"
PB_PACKAGE = "gateway.grpc.pb"

# Generated code is neither linted nor type-checked (protobuf and grpc ship no type information).
HEADER = "# mypy: ignore-errors\n# ruff: noqa\n"
_IMPORT = re.compile(r"^from (gateway\.v\d+) import ", re.MULTILINE)


class CodegenError(RuntimeError):
    """`make proto` found no .proto files, or protoc failed; its own diagnostics were printed to stderr.

    Do: fix the .proto file as protoc's diagnostics say, then run `make proto` again.
    """


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    return sorted(proto_root.rglob("*.proto"))


def generate(proto_root: Path = PROTO_ROOT, out_dir: Path = PB_ROOT) -> list[Path]:
    """Regenerate `out_dir` from scratch; returns the generated Python files."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    _run_protoc(proto_root, out_dir, proto_files(proto_root))
    generated = sorted(out_dir.rglob("*.py")) + sorted(out_dir.rglob("*.pyi"))
    for path in generated:
        _postprocess(path)
    _add_package_markers(out_dir)
    return generated


def is_stale(proto_root: Path = PROTO_ROOT, out_dir: Path = PB_ROOT) -> bool:
    """True when an output is missing or older than any proto file."""
    outputs = [out_dir / p.relative_to(proto_root).with_name(f"{p.stem}_pb2_grpc.py") for p in proto_files(proto_root)]
    if not all(path.exists() for path in outputs):
        return True
    newest_proto = max(p.stat().st_mtime for p in proto_files(proto_root))
    return any(path.stat().st_mtime < newest_proto for path in outputs)


def ensure_generated() -> None:
    """Generate only when needed (tests call this before importing `pb`)."""
    if is_stale():
        generate()


def main() -> int:
    """`python -m gateway.grpc.codegen`: regenerate unconditionally; exit status 1 when protoc fails."""
    try:
        generated = generate()
    except CodegenError as exc:
        print(f"codegen: {exc}", file=sys.stderr)
        return 1
    print(f"codegen: wrote {len(generated)} files under {PB_ROOT}")
    return 0


def _run_protoc(proto_root: Path, out_dir: Path, protos: list[Path]) -> None:
    if not protos:
        raise CodegenError(f"no .proto files under {proto_root}")
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(p) for p in protos),
    ]
    code = protoc.main(args)
    if code != 0:
        raise CodegenError(f"protoc exited with {code} for {len(protos)} proto files under {proto_root}")


def _postprocess(path: Path) -> None:
    text = _IMPORT.sub(rf"from {PB_PACKAGE}.\1 import ", path.read_text())
    path.write_text(HEADER + text)


def _add_package_markers(out_dir: Path) -> None:
    for directory in [out_dir, *(d for d in out_dir.rglob("*") if d.is_dir())]:
        (directory / "__init__.py").touch()


if __name__ == "__main__":
    raise SystemExit(main())
