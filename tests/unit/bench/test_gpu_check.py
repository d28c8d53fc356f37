"""The GPU check (bench/gpu_check): its dry path here, where every GPU step says why it cannot run; the NVML readings
in the metric shapes the gateway parses; the carried wheels' parts; and a failed step leaving the others to run."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.gpu_check import gateway_parse, nvml_readings, wheels
from bench.gpu_check.__main__ import run
from bench.gpu_check.steps import Clock, Record, StepSkipped, run_step

H100 = nvml_readings.GpuReading(
    index=0,
    uuid="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005",
    name="NVIDIA H100 80GB HBM3",
    pci_bus_id="00000000:18:00.0",
    memory_used_bytes=21_474_836_480 + 12_345,
    memory_total_bytes=85_520_809_984,
    utilization_percent=87.0,
    temperature_celsius=71.0,
    power_watts=612.345,
    power_limit_watts=700.0,
    clock_event_reasons=0x4 | 0x40,
    sm_clock_mhz=1755.0,
    energy_millijoules=123_456_789.0,
)


@pytest.mark.slow  # exports a tiny model's graphs: about 4 s
def test_the_dry_run_runs_every_step_it_can_and_says_why_the_gpu_ones_cannot(tmp_path: Path) -> None:
    # Triton's step is left out here (it starts a server: `make gpu-check` runs it); the others run on the CPU.
    code = run(
        [
            "--dry-run",
            "--steps",
            "nvml,wheels,model,torch,onnx",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
        ]
    )
    assert code == 0
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    steps = results["steps"]
    assert results["dry_run"] is True and results["summary"]["model"] == "ok"
    assert steps["nvml"]["status"] == "skipped" and "no GPU" in steps["nvml"]["reason"]
    assert steps["wheels"]["status"] == "skipped" and "carry.sh" in steps["wheels"]["reason"]
    torch_step = steps["torch"]
    assert torch_step["status"] == "ok" and torch_step["device"].startswith("cpu")
    assert torch_step["parity_fp16_vs_fp32"]["passed"] is True
    assert {(p["batch"], p["tokens"]) for p in torch_step["fp16"]["points"]} == {(1, 16), (4, 16)}
    onnx_step = steps["onnx"]
    assert onnx_step["status"] == "ok" and "no CUDA provider" in onnx_step["cuda_unavailable"]
    assert onnx_step["parity_vs_torch_fp32"]["min_cosine"] > 0.9999
    assert steps["triton"] == {"status": "skipped", "reason": "not asked for (--steps)", "seconds": 0}


def test_nvml_readings_render_as_triton_and_dcgm_serve_them_and_parse_back_whole() -> None:
    text = nvml_readings.triton_text([H100]) + nvml_readings.dcgm_text([H100], hostname="gpu-node-1", driver="580.1")
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"} 612.345000' in text
    assert "DCGM_FI_DEV_FB_USED{" in text and 'modelName="NVIDIA H100 80GB HBM3"' in text
    assert nvml_readings.check_text(text) == 15
    parsed = gateway_parse.agreement([H100], text)
    assert parsed["agrees"] is True, parsed["mismatches"]
    assert nvml_readings.reason_names(0x4 | 0x40 | 0x1000) == ["sw_power_cap", "hw_thermal_slowdown", "unknown_0x1000"]


class FakeNvml:
    """Stands in for the NVIDIA driver's library (pynvml) on a machine without one: one H100 whose driver does not
    report energy. The lent machine's run reads the real one."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM = 0, 1

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return H100.uuid

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return H100.name.encode()  # older pynvml answers bytes

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=H100.pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=H100.memory_used_bytes, total=H100.memory_total_bytes)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 71

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 612_345  # mW

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return 700_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return 0x44

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        return 1755

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        raise self.NVMLError("Not Supported")


def test_nvml_is_read_in_the_units_the_metrics_use_and_sampled_under_load() -> None:
    (reading,) = nvml_readings.read_gpus(FakeNvml())
    assert reading.name == H100.name and reading.power_watts == 612.345 and reading.power_limit_watts == 700
    assert reading.clock_event_reasons == 0x44 and reading.energy_millijoules is None
    since = time.monotonic()
    sampler = nvml_readings.Sampler(FakeNvml(), interval_seconds=0.01)
    time.sleep(0.1)
    sampler.stop()
    peaks = sampler.peaks(since)
    assert peaks["samples"] >= 2
    assert peaks["gpus"]["0"]["max_power_watts"] == 612.345
    assert peaks["gpus"]["0"]["clock_event_reasons_seen"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert [r.uuid for r in sampler.hottest(since)] == [H100.uuid]


def test_a_field_the_gpu_does_not_report_is_left_out_not_written_as_zero() -> None:
    bare = nvml_readings.GpuReading(0, "GPU-1", "GPU", "0", 1, 2, None, None, None, None, None, None)
    text = nvml_readings.triton_text([bare]) + nvml_readings.dcgm_text([bare], hostname="h")
    assert "nv_gpu_power_usage" not in text and "DCGM_FI_DEV_GPU_TEMP" not in text
    assert "nv_gpu_memory_used_bytes" in text


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    members = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in members) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, text in {**members, f"{info}/RECORD": record}.items():
            archive.writestr(path, text)
    return wheel


@pytest.mark.slow  # runs xz and pip: about 1 s
def test_carried_wheel_parts_are_checked_then_installed_apart_for_the_stubs(tmp_path: Path) -> None:
    source = tmp_path / "downloaded"
    padding = f"# {secrets.token_hex(4000)}\n"  # incompressible: the stream must span several parts
    make_wheel(source, "gpucheckdemo", "1.0", {"gpucheckdemo/__init__.py": f"VALUE = 42\n{padding}"})
    make_wheel(source, "numpy", "1.26.4", {"numpy_stub_marker/__init__.py": ""})
    carry = tmp_path / "run" / "carry"
    manifest = wheels.pack(source, carry, part_mib=0.002)
    assert manifest["parts"] >= 2 and sorted(p.name for p in carry.iterdir())[0] == "part-1"

    last = carry / f"part-{manifest['parts']}"
    aside = tmp_path / "aside"
    last.rename(aside)
    with pytest.raises(StepSkipped, match=f"still to carry .*part-{manifest['parts']}"):
        wheels.join_parts(carry, tmp_path / "work")
    aside.rename(last)

    site, stub_site = tmp_path / "site", tmp_path / "site-stub"
    result = wheels.install(carry, tmp_path / "work", site, stub_site)
    assert result["stub_only"] == ["numpy-1.26.4-py3-none-any.whl"]
    assert (stub_site / "numpy_stub_marker").is_dir() and not (site / "numpy_stub_marker").exists()
    imported = subprocess.run(
        [sys.executable, "-c", "import gpucheckdemo; print(gpucheckdemo.VALUE)"],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "42"


def test_the_triton_wheel_keeps_only_the_stub_of_the_machines_python(tmp_path: Path) -> None:
    stubs = {f"pytriton/tritonserver/python_backend_stubs/3.{m}/triton_python_backend_stub": "x" for m in range(8, 14)}
    libs = {"nvidia_pytriton.libs/libpython3-419a3a08.13.so.1.0": "x", "nvidia_pytriton.libs/libdcgm-1.so.3": "x"}
    wheel = make_wheel(tmp_path / "in", "nvidia_pytriton", "0.7.0", {**stubs, **libs})
    (tmp_path / "out").mkdir()
    with zipfile.ZipFile(wheels.stored_copy(wheel, tmp_path / "out")) as trimmed:
        names = trimmed.namelist()
        record = trimmed.read("nvidia_pytriton-0.7.0.dist-info/RECORD").decode()
        assert {info.compress_type for info in trimmed.infolist()} == {zipfile.ZIP_STORED}
    kept = [n for n in names if "python_backend_stubs" in n or n.startswith("nvidia_pytriton.libs/")]
    assert sorted(kept) == [
        "nvidia_pytriton.libs/libdcgm-1.so.3",
        "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub",
    ]
    assert "3.13" not in record and "python_backend_stubs/3.12/" in record


def test_a_failed_step_is_recorded_with_its_error_and_the_next_still_runs(tmp_path: Path) -> None:
    clock, record = Clock(60), Record(tmp_path, {"check": "test"})

    def broken() -> dict[str, object]:
        raise ValueError("no such tensor")

    assert run_step("first", clock, record, 1, broken) is None
    assert run_step("second", clock, record, 1, lambda: {"answer": 1}) == {"answer": 1}
    assert run_step("third", clock, record, 120, lambda: {}) is None
    steps = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]
    assert steps["first"]["status"] == "failed" and steps["first"]["reason"] == "ValueError: no such tensor"
    assert steps["second"]["status"] == "ok" and steps["second"]["answer"] == 1
    assert steps["third"]["status"] == "skipped" and "needs ~120 s" in steps["third"]["reason"]
