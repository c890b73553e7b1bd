"""The integer-storage INT8 graph for onnxruntime's CPU provider (``calibration/integer.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.gate import action_errors
from sac_edge.calibration.graph import layer_name, linear_nodes
from sac_edge.calibration.integer import integer_graph
from sac_edge.calibration.qdq import float_layers_of, quantizable_tensors, quantize_model
from sac_edge.calibration.session import OnnxPolicy, collect_activations
from sac_edge.calibration.states import StateSets
from sac_edge.common.spec import PolicySpec


@pytest.fixture(scope="module")
def qdq(fp32_model: onnx.ModelProto, states: StateSets) -> onnx.ModelProto:
    acts = collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model)))
    return quantize_model(fp32_model, compute_amax(acts, "entropy"))


def optimised_ops(model: onnx.ModelProto, tmp_path: Path) -> list[str]:
    """The node types onnxruntime's CPU provider runs after its graph optimisations."""
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


def test_onnxruntime_runs_integer_gemms_on_it(qdq: onnx.ModelProto, tmp_path: Path) -> None:
    layers = len(linear_nodes(qdq))
    ops = optimised_ops(integer_graph(qdq), tmp_path)
    assert ops.count("QGemm") == layers
    assert not {"Gemm", "FusedGemm", "MatMul", "DequantizeLinear"} & set(ops)
    # the TensorRT-form graph it comes from runs float GEMMs on the CPU: the reason this graph exists
    assert "QGemm" not in optimised_ops(qdq, tmp_path)


def test_weights_are_stored_as_int8_and_biases_as_int32(qdq: onnx.ModelProto, fp32_model: onnx.ModelProto) -> None:
    cpu = integer_graph(qdq)
    types = {i.name: i.data_type for i in cpu.graph.initializer}
    for node in linear_nodes(fp32_model):
        assert node.input[1] not in types and node.input[2] not in types  # no float weight or bias is left
        assert types[f"{node.input[2]}_int32"] == onnx.TensorProto.INT32
    assert sum(t == onnx.TensorProto.INT8 for t in types.values()) >= len(linear_nodes(fp32_model))
    src = {i.name: numpy_helper.to_array(i) for i in fp32_model.graph.initializer}
    int8_bytes = sum(numpy_helper.to_array(i).nbytes for i in cpu.graph.initializer if i.name.endswith("_quantized"))
    assert int8_bytes == sum(src[n.input[1]].nbytes for n in linear_nodes(fp32_model)) // 4
    assert float_layers_of(cpu) == []


def test_weights_are_the_qdq_graphs_rounded_weights(qdq: onnx.ModelProto) -> None:
    """The int8 values times their scales are exactly what the Q/DQ graph's DequantizeLinear produces."""
    cpu = integer_graph(qdq)
    inits = {i.name: numpy_helper.to_array(i) for i in cpu.graph.initializer}
    src = {i.name: numpy_helper.to_array(i) for i in qdq.graph.initializer}
    for node in qdq.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in src:
            w, scale = src[node.input[0]], src[node.input[1]]
            q = inits[node.output[0]]
            assert q.dtype == np.int8 and q.shape == w.shape and np.abs(q).max() <= 127
            expected = np.clip(np.rint(w / scale[:, None]), -127, 127)
            np.testing.assert_array_equal(q.astype(np.float64), expected)


def test_actions_match_the_qdq_graph(
    qdq: onnx.ModelProto, fp32_model: onnx.ModelProto, states: StateSets, spec: PolicySpec
) -> None:
    fp32, int8, cpu = OnnxPolicy(fp32_model), OnnxPolicy(qdq), OnnxPolicy(integer_graph(qdq))
    low, high = spec.action_low, spec.action_high
    qdq_mean = action_errors(fp32, int8, states.holdout, low, high)[3]
    cpu_mean = action_errors(fp32, cpu, states.holdout, low, high)[3]
    assert cpu_mean <= max(1.5 * qdq_mean, 1e-3)
    assert action_errors(int8, cpu, states.holdout, low, high)[3] < 0.01


def test_a_layer_kept_in_float_stays_float(fp32_model: onnx.ModelProto, states: StateSets) -> None:
    last = layer_name(linear_nodes(fp32_model)[-1])
    acts = collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model)))
    mixed = quantize_model(fp32_model, compute_amax(acts, "entropy"), float_layers={last})
    cpu = integer_graph(mixed)
    gemm = next(n for n in cpu.graph.node if layer_name(n) == last)
    floats = {i.name for i in cpu.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    assert gemm.input[1] in floats and gemm.input[2] in floats
    assert float_layers_of(cpu) == [last]
