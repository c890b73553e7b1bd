from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sac_edge.calibration.calibrators import compute_amax
from sac_edge.calibration.check import check_qdq
from sac_edge.calibration.graph import constants, layer_name, linear_nodes, producers
from sac_edge.calibration.qdq import float_layers_of, quantizable_tensors, quantize_model
from sac_edge.calibration.session import OnnxPolicy, collect_activations
from sac_edge.calibration.states import StateSets
from sac_edge.common.errors import SacEdgeError


@pytest.fixture(scope="module")
def amax(fp32_model: onnx.ModelProto, states: StateSets) -> dict[str, float]:
    acts = collect_activations(fp32_model, states.calibration, list(quantizable_tensors(fp32_model)))
    return compute_amax(acts, "minmax")


@pytest.fixture(scope="module")
def int8_model(fp32_model: onnx.ModelProto, amax: dict[str, float]) -> onnx.ModelProto:
    return quantize_model(fp32_model, amax)


def test_qdq_model_follows_tensorrt_rules(int8_model: onnx.ModelProto) -> None:
    assert check_qdq(int8_model) == []
    onnx.checker.check_model(int8_model, full_check=True)
    made_by, const = producers(int8_model), constants(int8_model)
    for node in linear_nodes(int8_model):
        data, weight = (made_by[node.input[i]] for i in (0, 1))
        assert data.op_type == weight.op_type == "DequantizeLinear"
        w_scale = const[weight.input[1]]
        w = const[made_by[weight.input[0]].input[0]]  # float weight behind Q -> DQ
        assert w.dtype == np.float32 and w_scale.shape == (w.shape[0],)  # transB=1: channels on axis 0
        assert {a.name: a.i for a in weight.attribute}["axis"] == 0
        assert const[data.input[1]].shape == () and const[data.input[2]].dtype == np.int8
        assert node.input[2] not in made_by and const[node.input[2]].dtype == np.float32  # bias stays float
    assert not [n for n in int8_model.graph.node if n.op_type == "DequantizeLinear" and const[n.input[2]].any()]


def _fake_quant_reference(model: onnx.ModelProto, amax: dict[str, float], obs: np.ndarray) -> np.ndarray:
    """The policy in numpy with TensorRT's int8 semantics: x_q = clip(rint(x / s), -128, 127) * s on each
    layer input (s = amax / 127), per-row weight scales max|w| / 127, float bias, ReLU, tanh, scaling."""
    const = constants(model)
    acts = collect_activations(model, obs, [linear_nodes(model)[0].input[0]])
    x = next(iter(acts.values())).astype(np.float64)
    for i, node in enumerate(linear_nodes(model)):
        s = amax[node.input[0]] / 127
        x = np.clip(np.rint(x / s), -128, 127) * s
        w = const[node.input[1]].astype(np.float64)
        ws = np.abs(w).max(axis=1, keepdims=True) / 127
        x = x @ (np.rint(w / ws) * ws).T + const[node.input[2]]
        if i < len(linear_nodes(model)) - 1:
            x = np.maximum(x, 0.0)
    return np.tanh(x) * const["act_scale"] + const["act_bias"]


def test_qdq_model_computes_symmetric_int8(
    fp32_onnx: Path, fp32_model: onnx.ModelProto, int8_model: onnx.ModelProto, amax: dict[str, float], states: StateSets
) -> None:
    got = OnnxPolicy(int8_model)(states.holdout)
    diff = np.abs(got - _fake_quant_reference(fp32_model, amax, states.holdout))
    # float32 (ORT) vs float64 (numpy) flips a rounding decision now and then, which this high-gain policy
    # amplifies; everywhere else the two agree to float precision
    assert np.mean(diff < 1e-4) > 0.95, np.quantile(diff, [0.5, 0.9, 0.99])
    err = np.abs(got - OnnxPolicy(fp32_onnx)(states.holdout))
    assert err.max() > 0 and err.mean() < 0.05 * 4.0  # quantised, and close to fp32 (action range 4)


def test_mixed_precision_keeps_layers_float(fp32_model: onnx.ModelProto, amax: dict[str, float]) -> None:
    last = layer_name(linear_nodes(fp32_model)[-1])
    mixed = quantize_model(fp32_model, amax, float_layers={last})
    assert float_layers_of(mixed) == [last]
    assert check_qdq(mixed) == []
    flagged = check_qdq(mixed, float_layers=[])
    assert any(last in v and "input 0" in v for v in flagged) and any(last in v and "input 1" in v for v in flagged)
    with pytest.raises(SacEdgeError, match="not MatMul/Gemm"):
        quantize_model(fp32_model, amax, float_layers={"nope"})


def _ort_quantize(fp32_onnx: Path, states: StateSets, out: Path, **options: object) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"obs": states.calibration[i : i + 128]} for i in range(0, 512, 128)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    quantize_static(str(fp32_onnx), str(out), Reader(), **options)
    return onnx.load(str(out))


def test_checker_flags_ort_default_quantize_static(fp32_onnx: Path, states: StateSets, tmp_path: Path) -> None:
    violations = check_qdq(_ort_quantize(fp32_onnx, states, tmp_path / "ort_default.onnx"))
    text = "\n".join(violations)
    assert "int32 DequantizeLinear" in text  # biases quantised to int32
    assert "is quantised; TensorRT needs biases in float" in text
    assert "zero point is non-zero" in text  # asymmetric activations
    assert "per output channel" in text  # per-tensor weights
    assert all("\n" not in v for v in violations)


def test_checker_passes_ort_configured_for_tensorrt(fp32_onnx: Path, states: StateSets, tmp_path: Path) -> None:
    from onnxruntime.quantization import QuantType

    model = _ort_quantize(
        fp32_onnx,
        states,
        tmp_path / "ort_trt.onnx",
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["Gemm"],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
    )
    assert check_qdq(model) == []  # int8 weight initializers + DequantizeLinear are also valid


def _matmul_model(w: np.ndarray, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Add", ["y", "b"], ["z"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", w.shape[0]])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", w.shape[1]])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(w.shape[1], np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_matmul_weights_use_last_axis_and_checker_catches_wrong_axis() -> None:
    w = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    q = quantize_model(_matmul_model(w), {"x": 2.0})
    assert check_qdq(q) == []
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w"))
    assert constants(q)[dq.input[1]].shape == (6,)
    x = np.random.default_rng(1).uniform(-2, 2, (16, 4)).astype(np.float32)
    np.testing.assert_allclose(OnnxPolicy(q)(x), x @ w + 1, atol=0.1)
    for node in q.graph.node:  # move the weight scales onto the wrong axis (with matching length)
        if node.input[0] in ("w", dq.input[0]):
            for a in node.attribute:
                if a.name == "axis":
                    a.i = 0
    assert any("axis 0, the output-channel axis is 1" in v for v in check_qdq(q))


def test_checker_flags_unquantised_layer_missing_zero_point_and_qlinear_ops() -> None:
    w = np.ones((4, 6), np.float32)
    plain = _matmul_model(w)
    assert any("not explicitly quantised" in v for v in check_qdq(plain))
    assert any("mm: input 0 (x)" in v for v in check_qdq(plain))
    q = quantize_model(plain, {"x": 1.0})
    node = next(n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    del node.input[2]
    assert any("no zero point (defaults to uint8)" in v for v in check_qdq(q))
    q.graph.node.append(helper.make_node("QLinearMatMul", ["a"] * 8, ["o"], name="qlm"))
    assert any("qlm: QLinearMatMul is not supported" in v for v in check_qdq(q))


def test_low_opset_is_refused() -> None:
    with pytest.raises(SacEdgeError, match="opset >= 13"):
        quantize_model(_matmul_model(np.ones((2, 2), np.float32), opset=11), {"x": 1.0})
    assert any("opset 11" in v for v in check_qdq(_matmul_model(np.ones((2, 2), np.float32), opset=11)))
