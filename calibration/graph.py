"""ONNX graph look-ups shared by activation collection, Q/DQ insertion and the checker.

The quantised layers are the MatMul/Gemm nodes (an SAC actor is an MLP); everything else stays float.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from sac_edge.common.errors import SacEdgeError

LINEAR_OPS = ("MatMul", "Gemm")
MIN_OPSET = 13  # per-channel QuantizeLinear/DequantizeLinear (the ``axis`` attribute) needs opset 13


def default_opset(model: onnx.ModelProto) -> int:
    """The opset version of the default ONNX domain."""
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def layer_name(node: onnx.NodeProto) -> str:
    """A node's stable identifier: its name, or its first output when the exporter left it unnamed."""
    return node.name or node.output[0]


def linear_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The MatMul/Gemm nodes, in graph order."""
    return [n for n in model.graph.node if n.op_type in LINEAR_OPS and n.domain in ("", "ai.onnx")]


def constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every constant tensor by name: initializers and ``Constant`` node outputs (tensor values only)."""
    out = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """Tensor name -> the node that writes it."""
    return {out: node for node in model.graph.node for out in node.output if out}


def consumers(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it."""
    table: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name:
                table.setdefault(name, []).append(node)
    return table


def attr(node: onnx.NodeProto, name: str, default: int) -> int:
    """An integer attribute of ``node`` (ONNX default when absent)."""
    for a in node.attribute:
        if a.name == name:
            return int(onnx.helper.get_attribute_value(a))
    return default


class LinearInputs(NamedTuple):
    """The two multiplied inputs of a MatMul/Gemm and where its output channels lie in the weight."""

    data: tuple[str, ...]  # activation inputs (per-tensor Q/DQ)
    weight: str | None  # constant input multiplied in (per-channel Q/DQ), if any
    weight_axis: int | None  # output-channel axis of ``weight``


def linear_inputs(node: onnx.NodeProto, const: dict[str, np.ndarray]) -> LinearInputs:
    """Split a MatMul/Gemm's multiplied inputs into activations and a per-channel-quantisable weight.

    Output channels: Gemm ``B`` is ``[K, N]``, or ``[N, K]`` with ``transB=1`` (torch's Linear export), so the
    axis is 1 or 0; MatMul ``B`` is ``[..., K, N]``, axis -1. A constant ``A`` (rare) is quantised
    per-tensor like an activation: its rows are not output channels. Gemm's bias ``C`` is never multiplied
    and stays float (TensorRT rejects int32 bias Q/DQ).
    """
    a, b = node.input[0], node.input[1]
    data = (a,) if b in const else (a, b)
    if b not in const:
        return LinearInputs(data, None, None)
    rank = const[b].ndim
    if rank < 2:
        raise SacEdgeError(f"{layer_name(node)}: weight {b} has rank {rank}; expected a matrix")
    if node.op_type == "Gemm":
        return LinearInputs(data, b, 0 if attr(node, "transB", 0) else 1)
    return LinearInputs(data, b, rank - 1)
