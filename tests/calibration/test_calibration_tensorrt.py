"""TensorRT takes policy.int8.onnx as is (explicit Q/DQ). Needs tensorrt + a CUDA device: skipped elsewhere."""

from __future__ import annotations

from typing import Any

import onnx
import pytest

from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.qdq import quantizable_tensors, quantize_model
from sac_edge.calibration.session import collect_activations
from sac_edge.calibration.states import StateSets
from sac_edge.common.spec import PolicySpec


def _network(trt: Any, builder: Any, model: onnx.ModelProto, logger: Any) -> Any:
    explicit = (
        0 if int(trt.__version__.split(".")[0]) >= 10 else 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    )
    network = builder.create_network(explicit)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse(model.SerializeToString())
    assert ok, [str(parser.get_error(i)) for i in range(parser.num_errors)]
    return network, parser


@pytest.mark.tensorrt
def test_tensorrt_builds_the_qdq_model(fp32_model: onnx.ModelProto, states: StateSets, spec: PolicySpec) -> None:
    import tensorrt as trt

    amax = compute_amax(collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model))))
    model = quantize_model(fp32_model, amax)  # every layer int8: exercises every Q/DQ pair
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network, _parser = _network(trt, builder, model, logger)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 256 << 20)
    profile = builder.create_optimization_profile()
    profile.set_shape("obs", (1, spec.obs_dim), (1, spec.obs_dim), (64, spec.obs_dim))
    config.add_optimization_profile(profile)
    assert builder.build_serialized_network(network, config) is not None
