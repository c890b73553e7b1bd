"""TensorRT takes policy.int8.onnx as is (explicit Q/DQ). The build needs tensorrt + a CUDA device (skipped
elsewhere); the same calls run here on each generation's ``fake_tensorrt``, so a name a release lacks (the
``BuilderFlag.INT8`` TensorRT 11 removed) or deprecates fails on the CPU, not first on a device."""

from __future__ import annotations

import sys
from typing import Any

import onnx
import pytest
from api_surface import VERSIONS, load
from fake_tensorrt import fake_tensorrt

from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.qdq import quantizable_tensors, quantize_model
from sac_edge.calibration.session import collect_activations
from sac_edge.calibration.states import StateSets
from sac_edge.common.spec import PolicySpec
from sac_edge.common.trt.generations import generation


def _build_qdq(trt: Any, model: onnx.ModelProto, obs_dim: int) -> Any:
    """``model`` (Q/DQ) built as this TensorRT generation builds INT8: the INT8 flag only where the release
    has precision flags, a strongly typed network on 10.12+ (and always on 11)."""
    gen = generation(trt.__version__)
    flags = 0
    if gen.explicit_batch_flag:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    elif gen.strongly_typed_flag:
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    if gen.precision_flags:
        config.set_flag(trt.BuilderFlag.INT8)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 256 << 20)
    profile = builder.create_optimization_profile()
    profile.set_shape("obs", (1, obs_dim), (1, obs_dim), (64, obs_dim))
    config.add_optimization_profile(profile)
    return builder.build_serialized_network(network, config)


def _qdq_model(fp32_model: onnx.ModelProto, states: StateSets) -> onnx.ModelProto:
    amax = compute_amax(collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model))))
    return quantize_model(fp32_model, amax)  # every layer int8: exercises every Q/DQ pair


@pytest.mark.tensorrt
def test_tensorrt_builds_the_qdq_model(fp32_model: onnx.ModelProto, states: StateSets, spec: PolicySpec) -> None:
    import tensorrt as trt

    assert _build_qdq(trt, _qdq_model(fp32_model, states), spec.obs_dim) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_the_qdq_build_uses_only_each_generations_own_names(
    version: str, fp32_model: onnx.ModelProto, states: StateSets, spec: PolicySpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    trt, used = fake_tensorrt(version)  # raises on a name the release lacks
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    assert _build_qdq(trt, _qdq_model(fp32_model, states), spec.obs_dim) is not None
    surface = load(version)
    for use in used:
        if use.startswith("set_flag:BuilderFlag."):
            assert surface.deprecated("BuilderFlag", use.rpartition(".")[2]) is None, (version, use)
