"""The wheels a lent machine lacks, carried in parts: packed here, put together and installed there.

A call to the lent machine carries at most 64 MiB, the working tree included, and the machine reaches no package
index. `pack` rewrites each wheel uncompressed (the same files and RECORD, so still a valid wheel), puts them in
one tar, compresses it with xz (the wheels' own deflate leaves about a fifth for xz to find: onnxruntime-gpu's
244 MiB become 194) and cuts it into `part-N/` folders, each with a manifest. Each call carries one folder; a
warm machine keeps the folders of earlier calls. `install` checks that every part is there and that the joined
stream has the manifest's SHA-256, unpacks the wheels and installs them with `pip install --no-index --no-deps
--target`, then puts the target first on `sys.path` and `PYTHONPATH` (Triton's python-backend stubs inherit it).

    python -m bench.gpu_check.wheels pack --wheels DIR --carry DIR [--part-mib 60]   (bench/gpu_check/carry.sh)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from bench.gpu_check.steps import StepSkipped

MANIFEST = "MANIFEST.json"
DEVICE_PYTHON = "3.12"  # the lent machines' python3
# Installed apart, for Triton's python-backend stubs alone: Triton 2.51's python backend misreads BYTES tensors
# under numpy 2 (seen on CPython 3.12: bge_tokenizer's warm-up aborts in deserialize_bytes_tensor), while the
# machine's torch and the check itself keep the machine's numpy 2.
STUB_ONLY = ("numpy-",)
STREAM = "wheels.tar.xz"
MIB = 1 << 20


def left_out(member: str) -> bool:
    """Wheel members no step uses on a lent machine: the Triton wheel's python-backend stubs of the other CPython
    versions (it ships one for each of 3.8 to 3.13) and the libpython only the 3.13 stub links to, onnxruntime-gpu's
    TensorRT provider (the machine has no TensorRT) and numpy's own tests. Leaving them here takes about 10 MiB off
    the stream, which is what keeps it within four parts."""
    if "/python_backend_stubs/" in member:
        return f"/python_backend_stubs/{DEVICE_PYTHON}/" not in member
    if member.startswith("nvidia_pytriton.libs/libpython3-"):
        return f".{DEVICE_PYTHON.split('.')[1]}.so" not in member
    return member == "onnxruntime/capi/libonnxruntime_providers_tensorrt.so" or (
        member.startswith("numpy/") and "/tests/" in member
    )


def stored_copy(wheel: Path, dest: Path) -> Path:
    """`wheel` rewritten with every member uncompressed (xz then compresses the files themselves), in the same order,
    less what `left_out` names (and their lines in RECORD, so that the wheel stays consistent)."""
    target = dest / wheel.name
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as stored:
        for info in source.infolist():
            if left_out(info.filename):
                continue
            data = source.read(info)  # with the member's own compression, before its copy is changed
            if info.filename.endswith(".dist-info/RECORD"):
                kept = [line for line in data.decode().splitlines() if not left_out(line.split(",")[0])]
                data = ("\n".join(kept) + "\n").encode()
            member = copy.copy(info)
            member.compress_type = zipfile.ZIP_STORED
            stored.writestr(member, data)
    return target


def compress(tar: Path, out: Path) -> Path:
    """xz -9 on every core where the xz tool is here, else Python's lzma (one core, the same format)."""
    if shutil.which("xz"):
        with out.open("wb") as sink:
            subprocess.run(["xz", "-9", "-T0", "-c", str(tar)], stdout=sink, check=True)
    else:
        with tar.open("rb") as source, lzma.open(out, "wb", preset=9) as sink:
            shutil.copyfileobj(source, sink, 16 * MIB)
    return out


def pack(wheels_dir: Path, carry_dir: Path, part_mib: float) -> dict[str, Any]:
    """Every wheel in `wheels_dir` into `carry_dir/part-N/`, parts of at most `part_mib` MiB; returns the manifest.

    The compressed stream is kept beside `carry_dir` and used again while the wheels are the same (xz -9 takes
    minutes on two cores), so that cutting it into parts of another size is quick."""
    wheels = sorted(wheels_dir.glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {wheels_dir}")
    listed = [{"name": w.name, "bytes": w.stat().st_size} for w in wheels]
    # The same wheels packed by the same code (what `left_out` leaves out lives here) give the same stream.
    packing = {"wheels": listed, "packer": hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}
    stream, key = carry_dir.parent / STREAM, carry_dir.parent / f"{STREAM}.key.json"
    if not (stream.is_file() and key.is_file() and json.loads(key.read_text()) == packing):
        compress_wheels(wheels, stream)
        key.write_text(json.dumps(packing))
    data = stream.read_bytes()
    part_bytes = int(part_mib * MIB)
    chunks = [data[i : i + part_bytes] for i in range(0, len(data), part_bytes)]
    manifest = {"parts": len(chunks), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "wheels": listed}
    shutil.rmtree(carry_dir, ignore_errors=True)
    for number, chunk in enumerate(chunks, start=1):
        folder = carry_dir / f"part-{number}"
        folder.mkdir(parents=True)
        (folder / f"{STREAM}.{number:02d}").write_bytes(chunk)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def compress_wheels(wheels: list[Path], stream: Path) -> Path:
    """The wheels, each rewritten uncompressed, in one tar compressed into `stream`."""
    staging = stream.parent / "stored"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tar_path = stream.parent / "wheels.tar"
    with tarfile.open(tar_path, "w") as tar:
        for wheel in wheels:
            tar.add(stored_copy(wheel, staging), arcname=wheel.name)
    shutil.rmtree(staging)
    compress(tar_path, stream)
    tar_path.unlink()
    return stream


def _numbered(path: Path) -> int:
    return int(path.suffix.lstrip("."))


def join_parts(carry_dir: Path, work: Path) -> tuple[dict[str, Any], Path]:
    """The parts joined into one checked stream in `work`; StepSkipped names the parts still to carry."""
    manifests = sorted(carry_dir.glob(f"part-*/{MANIFEST}"))
    if not manifests:
        raise StepSkipped(f"no wheel parts under {carry_dir}: make them with bench/gpu_check/carry.sh")
    manifest: dict[str, Any] = json.loads(manifests[0].read_text())
    parts = {_numbered(p): p for p in carry_dir.glob(f"part-*/{STREAM}.*")}
    missing = [n for n in range(1, manifest["parts"] + 1) if n not in parts]
    if missing:
        raise StepSkipped(
            f"{len(parts)} of {manifest['parts']} wheel parts here; still to carry (one call each, to the same "
            f"warm machine): {', '.join(f'part-{n}' for n in missing)}"
        )
    work.mkdir(parents=True, exist_ok=True)
    joined = work / STREAM
    digest = hashlib.sha256()
    with joined.open("wb") as sink:
        for number in range(1, manifest["parts"] + 1):
            chunk = parts[number].read_bytes()
            digest.update(chunk)
            sink.write(chunk)
    if digest.hexdigest() != manifest["sha256"]:
        raise StepSkipped(
            f"the joined wheel parts do not match their manifest's SHA-256: carry them again ({carry_dir})"
        )
    return manifest, joined


def install(carry_dir: Path, work: Path, site: Path, stub_site: Path) -> dict[str, Any]:
    """Join, check, unpack and `pip install --no-index` the carried wheels: into `site`, from which this process then
    imports first, and those of `STUB_ONLY` into `stub_site`, which only the python-backend stubs import from."""
    manifest, joined = join_parts(carry_dir, work)
    unpacked = work / "wheels"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(joined, "r:xz") as tar:
        tar.extractall(unpacked, filter="data")
    joined.unlink()
    wheels = sorted(unpacked.glob("*.whl"))
    for_stubs = [w for w in wheels if w.name.startswith(STUB_ONLY)]
    pip_install([w for w in wheels if w not in for_stubs], site)
    pip_install(for_stubs, stub_site)
    activate(site)
    return {
        "parts": manifest["parts"],
        "stream_mib": round(manifest["bytes"] / MIB, 1),
        "site": str(site),
        "wheels": [w.name for w in wheels],
        "stub_site": str(stub_site),
        "stub_only": [w.name for w in for_stubs],
    }


def pip_install(wheels: list[Path], target: Path) -> None:
    if not wheels:
        return
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    command += ["--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip install --no-index failed ({done.returncode}): {done.stderr.strip()[-1500:]}")


def activate(site: Path) -> None:
    """Import from `site` first, here and in every process started from here."""
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check.wheels", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="wheels -> part-N/ folders of the carry folder")
    packing.add_argument("--wheels", type=Path, required=True, help="folder of the downloaded wheels")
    packing.add_argument("--carry", type=Path, required=True, help="folder to write part-1/, part-2/, ... into")
    packing.add_argument("--part-mib", type=float, default=60.0, help="MiB per part (a call carries 64 in all)")
    args = parser.parse_args(argv)
    manifest = pack(args.wheels, args.carry, args.part_mib)
    for wheel in manifest["wheels"]:
        print(f"{wheel['bytes'] / MIB:8.1f} MiB  {wheel['name']}")
    total = sum(w["bytes"] for w in manifest["wheels"]) / MIB
    print(
        f"{total:8.1f} MiB of wheels -> {manifest['bytes'] / MIB:.1f} MiB xz in {manifest['parts']} part(s) of "
        f"<= {args.part_mib:g} MiB under {args.carry}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
