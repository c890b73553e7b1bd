"""policy.fp16.onnx: fp16 weights and tensors between layers, fp32 obs/action, parity-checked against fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from sac_edge.common.tolerance import tolerance
from sac_edge.export.fp16_onnx import to_fp16, write_fp16
from sac_edge.export.onnx_export import INPUT, OUTPUT, check_tensorrt_ops, export_policy
from sac_edge.export.parity import measure_parity, onnx_actions, require_parity
from sac_edge.export.source import load_source


@pytest.fixture(scope="module")
def graphs(pendulum_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    source = load_source(str(pendulum_run))
    root = tmp_path_factory.mktemp("fp16")
    export_policy(source.policy, source.spec.obs_dim, root / "policy.onnx")
    write_fp16(root / "policy.onnx", root / "policy.fp16.onnx", INPUT, OUTPUT)
    return root / "policy.onnx", root / "policy.fp16.onnx"


def test_fp16_graph_has_fp16_weights_and_fp32_io(graphs: tuple[Path, Path]) -> None:
    model = onnx.load(str(graphs[1]))
    io = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
    assert io == {INPUT: onnx.TensorProto.FLOAT, OUTPUT: onnx.TensorProto.FLOAT}
    kinds = {init.data_type for init in model.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in kinds and onnx.TensorProto.FLOAT not in kinds
    gemm_inputs = {n.input[0] for n in model.graph.node if n.op_type in ("Gemm", "MatMul")}
    inner = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    assert gemm_inputs and all(inner[name] == onnx.TensorProto.FLOAT16 for name in gemm_inputs)
    check_tensorrt_ops(model)  # still only ops TensorRT 8.5 parses (Cast included)


def test_fp16_parity_within_fp16_tolerance_and_not_bit_equal(graphs: tuple[Path, Path]) -> None:
    fp32, fp16 = graphs
    states = np.random.default_rng(0).normal(size=(2000, 3)).astype(np.float32) * 3
    tol = tolerance("fp16", [-2.0], [2.0])
    parity = measure_parity(fp16, lambda obs: onnx_actions(fp32, obs), "policy.onnx", states, "normal", tol)
    require_parity(parity)
    assert 0 < parity.max_abs <= tol  # fp16 rounding is really there, and within the tolerance
    assert parity.max_abs > tolerance("fp32", [-2.0], [2.0]) / 100


def test_fp16_keeps_huge_bounds_finite() -> None:
    from onnx import helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Clip", ["obs", "lo", "hi"], ["action"])],
        "g",
        [helper.make_tensor_value_info("obs", onnx.TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("action", onnx.TensorProto.FLOAT, ["b", 2])],
        [numpy_helper.from_array(np.float32(-1e9), "lo"), numpy_helper.from_array(np.float32(1e9), "hi")],
    )
    model = to_fp16(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "obs", "action")
    bounds = [numpy_helper.to_array(i) for i in model.graph.initializer]
    assert all(np.isfinite(b) and b.dtype == np.float16 for b in bounds)
