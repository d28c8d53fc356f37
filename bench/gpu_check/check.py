"""The check's steps in order, each within its share of the budget, each result written as soon as it is known.

nvml (the idle GPU, in the gateway's metric shapes; a sampler then follows every load) -> wheels (the carried
ones, installed before anything imports onnxruntime or protobuf) -> model (the random checkpoint and its
tokenizer) -> torch (FP16 against FP32) -> onnx (the exported graphs on the CUDA provider) -> triton (served
behind the gateway's client, with Triton's GPU metrics).
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import site
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.gpu_check import nvml_readings
from bench.gpu_check.plan import Plan
from bench.gpu_check.steps import Clock, Record, StepSkipped, run_step

STEPS = ("nvml", "wheels", "model", "torch", "onnx", "triton")


@dataclass
class Run:
    """What one run's steps share: the plan, the clock, and what earlier steps made."""

    plan: Plan
    clock: Clock
    record: Record
    work: Path
    out: Path
    wheels: Path | None
    seed: int = 0
    encoder: Any = None
    rows: Any = None
    tokenizer_file: Path | None = None
    graphs: dict[str, Path] | None = None
    nvml: Any = None
    driver: str | None = None
    sampler: nvml_readings.Sampler | None = None
    sites: list[Path] = field(default_factory=lambda: [Path(p) for p in site.getsitepackages()])
    stub_sites: list[Path] = field(default_factory=list)  # before `sites`, for Triton's python-backend stubs only

    def deadline(self, step: str) -> float:
        return time.monotonic() + min(self.plan.times[step].seconds, self.clock.left() - 5)

    def prometheus_text(self, readings: list[nvml_readings.GpuReading]) -> str:
        """Readings as Triton's metrics endpoint and the DCGM exporter would serve them (one text, both shapes)."""
        return nvml_readings.triton_text(readings) + nvml_readings.dcgm_text(readings, driver=self.driver)

    def under_load(self, since: float, prom_name: str | None = None) -> dict[str, Any] | str:
        """The sampler's peaks since `since`; with `prom_name`, the hottest reading is written as Prometheus text."""
        if self.sampler is None:
            return "no NVML sampler (see the nvml step)"
        if prom_name is not None:
            hottest = self.sampler.hottest(since)
            if hottest:
                (self.out / prom_name).write_text(self.prometheus_text(hottest), encoding="utf-8")
        return self.sampler.peaks(since)


def step_nvml(run: Run) -> dict[str, Any]:
    from bench.gpu_check import gateway_parse

    run.nvml = nvml_readings.open_nvml()
    run.driver = nvml_readings.driver_version(run.nvml)
    readings = nvml_readings.read_gpus(run.nvml)
    text = run.prometheus_text(readings)
    (run.out / "nvml_idle.prom").write_text(text, encoding="utf-8")
    run.sampler = nvml_readings.Sampler(run.nvml)
    return {
        "driver": run.driver,
        "gpus": [r.as_dict() for r in readings],
        "prometheus_samples": nvml_readings.check_text(text),
        "prometheus_file": "nvml_idle.prom",
        "gateway_parser": gateway_parse.agreement(readings, text),
    }


def step_wheels(run: Run) -> dict[str, Any]:
    from bench.gpu_check import wheels

    if run.wheels is None:
        raise StepSkipped(
            "no --wheels folder: onnxruntime-gpu, Triton and the gateway's client come as carried wheels "
            "(bench/gpu_check/carry.sh)"
        )
    target, stub_target = run.work / "site", run.work / "site-stub"
    result = wheels.install(run.wheels, run.work / "carried", target, stub_target)
    run.sites.insert(0, target)
    run.stub_sites.append(stub_target)
    return result


def step_model(run: Run) -> dict[str, Any]:
    from bench.gpu_check.model import random_encoder
    from bench.gpu_check.torch_check import ParityRows
    from bench.gpu_check.vocab import write_tokenizer

    shape = run.plan.shape
    run.encoder = random_encoder(shape, run.seed)
    run.rows = ParityRows(shape, run.seed, run.plan.parity_rows)
    run.tokenizer_file = write_tokenizer(run.work / "tokenizer.json", shape.vocab)
    parameters = sum(p.numel() for p in run.encoder.parameters())
    return {"shape": shape.as_dict(), "parameters": parameters, "seed": run.seed}


def needs_model(run: Run) -> None:
    if run.encoder is None:
        raise StepSkipped("the model step did not complete")


def step_torch(run: Run) -> dict[str, Any]:
    import torch

    from bench.gpu_check import torch_check

    needs_model(run)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not run.plan.dry_run:
        raise StepSkipped(f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none")
    since = time.monotonic()
    result = torch_check.run(run.encoder, run.plan, device, run.rows, run.deadline("torch"), run.clock.say, run.seed)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {**result, "gpu_under_load": run.under_load(since, "nvml_load.prom")}


def step_onnx(run: Run) -> dict[str, Any]:
    from bench.gpu_check import onnx_check

    needs_model(run)
    since = time.monotonic()
    deadline = run.deadline("onnx")
    result, run.graphs = onnx_check.run(
        run.encoder, run.plan, run.rows, run.work / "onnx", deadline, run.clock.say, run.seed
    )
    return {**result, "gpu_under_load": run.under_load(since)}


def step_triton(run: Run) -> dict[str, Any]:
    from bench.gpu_check import triton_check

    if run.graphs is None or run.tokenizer_file is None:
        raise StepSkipped("needs the onnx step's graphs, which it did not make")
    if importlib.util.find_spec("pytriton") is None:
        raise StepSkipped(
            "no tritonserver: the nvidia-pytriton wheel is not installed (carry it: bench/gpu_check/carry.sh)"
        )
    reason = triton_check.client_unavailable()
    if reason is not None:
        raise StepSkipped(reason)
    since = time.monotonic()
    sites = [*run.stub_sites, *run.sites]
    work, deadline = run.work / "triton", run.deadline("triton")
    result = triton_check.run(
        run.encoder, run.plan, run.graphs, run.tokenizer_file, sites, work, run.out, deadline, run.clock.say, run.seed
    )
    return {**result, "gateway_parser_on_triton": live_parse(run), "gpu_under_load": run.under_load(since)}


def live_parse(run: Run) -> dict[str, Any]:
    """The gateway's parse of Triton's live GPU metrics, beside NVML's reading of the same moment."""
    from bench.gpu_check import gateway_parse

    scraped = run.out / "triton_metrics.prom"
    now = nvml_readings.read_gpus(run.nvml) if run.nvml is not None else []
    return {
        "parsed": gateway_parse.parsed_readings(scraped.read_text()) if scraped.is_file() else "no scrape",
        "nvml_after_scrape": [r.as_dict() for r in now],
    }


BODIES: dict[str, Callable[[Run], dict[str, Any]]] = {
    "nvml": step_nvml,
    "wheels": step_wheels,
    "model": step_model,
    "torch": step_torch,
    "onnx": step_onnx,
    "triton": step_triton,
}


def header(plan: Plan, budget_seconds: float) -> dict[str, Any]:
    return {
        "check": "bench/gpu_check",
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "dry_run": plan.dry_run,
        "budget_seconds": budget_seconds,
        "machine": {
            "host": socket.gethostname(),
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "platform": platform.platform(),
        },
        "plan": {**asdict(plan), "shape": plan.shape.as_dict()},
    }


def main(plan: Plan, out: Path, work: Path, wheels: Path | None, budget_seconds: float, steps: tuple[str, ...]) -> int:
    """Run `steps` of the plan; returns 0 when every asked step ran, 1 when one failed (skips are findings)."""
    clock = Clock(budget_seconds)
    record = Record(out, header(plan, budget_seconds))
    run = Run(plan, clock, record, work, out, wheels)
    work.mkdir(parents=True, exist_ok=True)
    clock.say(f"GPU check{' (dry run)' if plan.dry_run else ''}: {plan.shape.name}, budget {budget_seconds:.0f} s")
    try:
        for name in STEPS:
            if name not in steps:
                record.step(name, {"status": "skipped", "reason": "not asked for (--steps)", "seconds": 0})
                continue
            run_step(name, clock, record, plan.times[name].minimum, functools.partial(BODIES[name], run))
    finally:
        if run.sampler is not None:
            run.sampler.stop()
    summary = {name: entry["status"] for name, entry in record.data["steps"].items()}
    record.data["summary"] = summary
    record.data["seconds"] = round(clock.elapsed(), 1)
    record.write()
    for name, entry in record.data["steps"].items():
        print(f"  {name:7s} {entry['status']:8s} {entry.get('seconds', 0):6.1f} s  {entry.get('reason', '')}")
    print(f"results: {record.path}", flush=True)
    return 1 if "failed" in summary.values() else 0
