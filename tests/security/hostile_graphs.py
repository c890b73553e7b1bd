"""ONNX graphs a hostile or broken bundle may carry in place of ``policy.onnx`` (obs ``[batch, 3]`` ->
action ``[batch, 1]``, Pendulum's sizes), and the re-hashed manifest that makes them pass the checksums."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sac_edge.common.bundle_format import MANIFEST
from sac_edge.common.manifest import file_entry, write_manifest

OBS, ACT = 3, 1


def _model(nodes: list[Any], initializers: list[Any], domains: tuple[str, ...] = ()) -> bytes:
    graph = helper.make_graph(
        nodes,
        "policy",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", OBS])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", ACT])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model.SerializeToString()


def endless_loop() -> bytes:
    """A ``Loop`` of 10^15 iterations after the first layer: loads, and the first inference never returns."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["x_in", "one"], ["x_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["batch", ACT]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["batch", ACT]),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [1, 1], [1.0])],
    )
    return _model(
        [
            helper.make_node("Gemm", ["obs", "w"], ["x0"]),
            helper.make_node("Loop", ["n", "go", "x0"], ["action"], body=body),
        ],
        [
            numpy_helper.from_array(np.zeros((OBS, ACT), np.float32), "w"),
            helper.make_tensor("n", TensorProto.INT64, [], [10**15]),
            helper.make_tensor("go", TensorProto.BOOL, [], [True]),
        ],
    )


def foreign_op() -> bytes:
    """One op of a custom domain (its kernel would come from whatever library registers the domain)."""
    return _model(
        [
            helper.make_node("Gemm", ["obs", "w"], ["x0"]),
            helper.make_node("Exfiltrate", ["x0"], ["action"], domain="ai.evil"),
        ],
        [numpy_helper.from_array(np.zeros((OBS, ACT), np.float32), "w")],
        domains=("ai.evil",),
    )


def matmul_policy() -> bytes:
    """A plain linear policy written with MatMul (an allowed op the export's Gemm graph does not use)."""
    return _model(
        [helper.make_node("MatMul", ["obs", "w"], ["action"])],
        [numpy_helper.from_array(np.full((OBS, ACT), 0.1, np.float32), "w")],
    )


def failing_reshape() -> bytes:
    """Allowed ops only; every run fails inside the graph (a Reshape of 3 values into 7 x 7, the shape computed
    from the input so that it is only known at run time), as an allocation failure would."""
    return _model(
        [
            helper.make_node("MatMul", ["obs", "zeros"], ["z"]),
            helper.make_node("Add", ["z", "sevens"], ["s"]),
            helper.make_node("Reshape", ["s", "two"], ["flat"]),
            helper.make_node("Cast", ["flat"], ["shape"], to=TensorProto.INT64),
            helper.make_node("Reshape", ["obs", "shape"], ["action"]),
        ],
        [
            numpy_helper.from_array(np.zeros((OBS, 2), np.float32), "zeros"),
            numpy_helper.from_array(np.full((1, 2), 7.0, np.float32), "sevens"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ],
    )


def fails_past_speed(limit: float) -> bytes:
    """A Pendulum policy graph (allowed ops only) that acts ``0.5 * cos(theta)`` and fails inside the graph once
    the joint's speed (the observation's third value) is past ``limit``: a backend that breaks mid-run. The
    action is reshaped to ``[1, 1 + (|speed| > limit)]``, which one value cannot fill."""
    f32 = np.float32
    consts = {
        "act_w": np.array([[0.5], [0.0], [0.0]], f32), "speed_w": np.array([[0.0], [0.0], [1.0]], f32),
        "minus": np.array(-1.0, f32), "limit": np.array(limit, f32), "big": np.array(1e6, f32),
        "zero": np.array(0.0, f32), "one": np.array(1.0, f32), "flat": np.array([1], np.int64),
        "base": np.array([1.0, 1.0], f32), "unit": np.array([0.0, 1.0], f32),
    }  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["obs", "act_w"], ["a"]),
        helper.make_node("MatMul", ["obs", "speed_w"], ["v"]),
        helper.make_node("Mul", ["v", "minus"], ["neg_v"]),
        helper.make_node("Max", ["v", "neg_v"], ["speed"]),
        helper.make_node("Sub", ["speed", "limit"], ["over"]),
        helper.make_node("Mul", ["over", "big"], ["steep"]),
        helper.make_node("Clip", ["steep", "zero", "one"], ["past"]),  # 1 past the limit, else 0
        helper.make_node("Reshape", ["past", "flat"], ["past1"]),
        helper.make_node("Mul", ["past1", "unit"], ["extra"]),
        helper.make_node("Add", ["base", "extra"], ["shape_f"]),
        helper.make_node("Cast", ["shape_f"], ["shape"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["a", "shape"], ["action"]),
    ]
    return _model(nodes, [numpy_helper.from_array(v, k) for k, v in consts.items()])


def long_chain(width: int = 512, depth: int = 4000) -> bytes:
    """Allowed ops only, and one inference takes minutes: ``depth`` products of ``width`` x ``width`` matrices
    (``width**3`` multiply-adds each, 5 x 10^11 in all: seconds even at 100 GFLOP/s on one core), the
    matrix an outer product of the first layer's output, so nothing folds at load."""
    nodes = [
        helper.make_node("Gemm", ["obs", "w_in"], ["a"]),
        helper.make_node("Reshape", ["a", "column"], ["col"]),
        helper.make_node("MatMul", ["col", "ones_row"], ["m0"]),
    ]
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [f"m{i}", "eye"], [f"m{i + 1}"]))
    nodes += [
        helper.make_node("MatMul", ["ones_row", f"m{depth}"], ["r"]),
        helper.make_node("Gemm", ["r", "w_out"], ["action"], alpha=1e-6),
    ]
    return _model(
        nodes,
        [
            numpy_helper.from_array(np.full((OBS, width), 0.01, np.float32), "w_in"),
            numpy_helper.from_array(np.array([width, 1], np.int64), "column"),
            numpy_helper.from_array(np.ones((1, width), np.float32), "ones_row"),
            numpy_helper.from_array(np.eye(width, dtype=np.float32), "eye"),
            numpy_helper.from_array(np.full((width, ACT), 0.01, np.float32), "w_out"),
        ],
    )


def plant(bundle: Path, graph: bytes, listed_ops: list[str] | None = None) -> None:
    """``graph`` as the bundle's ``policy.onnx`` with the manifest's sha256 updated (as an attacker who can
    write the bundle would), and with ``listed_ops`` as the manifest's ``onnx.ops`` when given."""
    (bundle / "policy.onnx").write_bytes(graph)
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"]["policy.onnx"] = file_entry(bundle, "policy.onnx", kind="onnx", precision="fp32")
    if listed_ops is not None:
        manifest["onnx"] = {"opset": 17, "ops": listed_ops}
    write_manifest(bundle, manifest)


def ops_of(path: Path) -> list[str]:
    return sorted({n.op_type for n in onnx.load(str(path)).graph.node})
