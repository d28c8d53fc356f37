"""Edits of a model config for `export.repository.copy_with_config`: the same repository, served another way."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc


def run_fp32(config: mc.ModelConfig) -> None:
    config.parameters["cpu_precision"].string_value = "fp32"


def run_on_gpu(config: mc.ModelConfig) -> None:
    config.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
