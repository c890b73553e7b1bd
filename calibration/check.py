"""Checks an ONNX graph against the explicit-quantization rules TensorRT needs, on any Q/DQ model.

Rules (onnx-tensorrt docs/operators.md, the TensorRT explicit-quantization guide, edge-facts.md): opset
>= 13; QDQ format only (no QLinear*/Integer/DynamicQuantizeLinear ops); int8 zero points present and 0
(a missing zero point means uint8; a non-zero one fails at parse with "TRT only supports symmetric
quantization - zeroPt must be all zeros"); positive finite scales; DequantizeLinear fed by a
QuantizeLinear with the same parameters or by an int8 constant in [-127, 127]; both multiplied inputs of
every MatMul/Gemm behind Q/DQ unless the model declares the layer float; activations per-tensor, weights
per-channel on the output-channel axis; biases float (no int32 bias Q/DQ).
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnx

from .graph import MIN_OPSET, attr, constants, default_opset, layer_name, linear_nodes, producers
from .qdq import INT8_MAX, float_layers_of

UNSUPPORTED_OPS = frozenset(
    {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QGemm", "QLinearAdd"}
)
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def check_qdq(model: onnx.ModelProto, float_layers: Collection[str] | None = None) -> list[str]:
    """Every violation of the TensorRT Q/DQ rules, one line each; empty when the graph is fine.

    ``float_layers``: MatMul/Gemm names allowed without Q/DQ; by default the list the model declares in its
    sac-edge metadata (none for a foreign model).
    """
    violations: list[str] = []
    opset = default_opset(model)
    if opset < MIN_OPSET:
        violations.append(f"opset {opset} < {MIN_OPSET}: per-channel Q/DQ (axis) needs opset >= {MIN_OPSET}")
    const = constants(model)
    made_by = producers(model)
    allowed = set(float_layers) if float_layers is not None else set(float_layers_of(model) or [])
    nodes = list(model.graph.node)
    if not any(n.op_type in QDQ_OPS for n in nodes):
        violations.append("no QuantizeLinear/DequantizeLinear nodes: the graph is not explicitly quantised")
    for node in nodes:
        if node.op_type in UNSUPPORTED_OPS:
            violations.append(f"{layer_name(node)}: {node.op_type} is not supported by TensorRT (use QDQ format)")
        elif node.op_type in QDQ_OPS:
            violations.extend(_check_qparams(node, const))
        if node.op_type == "DequantizeLinear":
            violations.extend(_check_dq_source(node, const, made_by))
    for node in linear_nodes(model):
        name = layer_name(node)
        if len(node.input) > 2 and node.input[2]:
            bias = made_by.get(node.input[2])
            if bias is not None and bias.op_type == "DequantizeLinear":
                violations.append(f"{name}: bias {node.input[2]} is quantised; TensorRT needs biases in float")
        if name in allowed:
            continue
        for index in (0, 1):
            violations.extend(_check_linear_input(node, index, const, made_by))
    return list(dict.fromkeys(violations))


def _check_qparams(node: onnx.NodeProto, const: dict[str, np.ndarray]) -> list[str]:
    """Scale positive and finite; zero point present, int8, all zero."""
    name, out = layer_name(node), []
    scale = const.get(node.input[1]) if len(node.input) > 1 else None
    if scale is None:
        out.append(f"{name}: {node.op_type} scale is not a constant")
    elif not (np.all(np.isfinite(scale)) and np.all(scale > 0)):
        out.append(f"{name}: {node.op_type} scale must be positive and finite")
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if not zp_name:
        out.append(f"{name}: {node.op_type} has no zero point (defaults to uint8); TensorRT needs int8 zero point 0")
        return out
    zp = const.get(zp_name)
    if zp is None:
        out.append(f"{name}: {node.op_type} zero point is not a constant")
    elif zp.dtype != np.int8 and not (node.op_type == "DequantizeLinear" and zp.dtype == np.int32):
        out.append(f"{name}: {node.op_type} zero point is {zp.dtype}, TensorRT needs int8 (symmetric int8)")
    if zp is not None and np.any(zp != 0):
        out.append(f"{name}: {node.op_type} zero point is non-zero (asymmetric); TensorRT needs zero point 0")
    return out


def _check_dq_source(
    node: onnx.NodeProto, const: dict[str, np.ndarray], made_by: dict[str, onnx.NodeProto]
) -> list[str]:
    """A DequantizeLinear reads a matching QuantizeLinear or an int8 constant in [-127, 127]."""
    name, src = layer_name(node), node.input[0]
    if src in const:
        values = const[src]
        if values.dtype == np.int32:
            return [f"{name}: int32 DequantizeLinear of {src} (int32 bias quantisation); TensorRT needs float biases"]
        if values.dtype != np.int8:
            return [f"{name}: DequantizeLinear of {values.dtype} constant {src}; TensorRT needs int8"]
        if values.size and int(values.min()) < -int(INT8_MAX):
            return [f"{name}: int8 weights {src} use -128; TensorRT's symmetric weight range is [-127, 127]"]
        return []
    q = made_by.get(src)
    if q is None or q.op_type != "QuantizeLinear":
        return [f"{name}: DequantizeLinear input {src} is neither a QuantizeLinear output nor an int8 constant"]
    same = len(q.input) >= 3 and len(node.input) >= 3 and q.input[1:3] == node.input[1:3]
    if not same and not _equal_params(q, node, const):
        return [f"{name}: DequantizeLinear parameters differ from its QuantizeLinear {layer_name(q)}"]
    return []


def _equal_params(q: onnx.NodeProto, dq: onnx.NodeProto, const: dict[str, np.ndarray]) -> bool:
    pairs = [(q.input[i] if len(q.input) > i else "", dq.input[i] if len(dq.input) > i else "") for i in (1, 2)]
    for a, b in pairs:
        if (a in const) != (b in const) or (a in const and not np.array_equal(const[a], const[b])):
            return False
    return attr(q, "axis", 1) == attr(dq, "axis", 1)


def _check_linear_input(
    node: onnx.NodeProto, index: int, const: dict[str, np.ndarray], made_by: dict[str, onnx.NodeProto]
) -> list[str]:
    """Input ``index`` of a MatMul/Gemm comes from Q/DQ, per-channel for a weight, per-tensor otherwise."""
    name, src = layer_name(node), node.input[index]
    dq = made_by.get(src)
    if dq is None or dq.op_type != "DequantizeLinear":
        return [f"{name}: input {index} ({src}) is not behind QuantizeLinear/DequantizeLinear"]
    scale = const.get(dq.input[1]) if len(dq.input) > 1 else None
    if scale is None:
        return []  # reported by _check_qparams
    weight = _weight_values(dq, const, made_by)
    if weight is None or index == 0:
        if scale.size != 1:
            return [f"{name}: activation input {index} ({src}) must use one per-tensor scale, has {scale.size}"]
        return []
    if weight.ndim < 2:
        return [f"{name}: weight input {src} has rank {weight.ndim}; expected a matrix"]
    axis = (0 if attr(node, "transB", 0) else 1) if node.op_type == "Gemm" else weight.ndim - 1
    channels = weight.shape[axis]
    dq_axis = attr(dq, "axis", 1) % weight.ndim
    if scale.size != channels or (scale.ndim != 1 and channels != 1):
        return [
            f"{name}: weight {src} must be quantised per output channel ({channels} scales on axis {axis}), "
            f"has {scale.size} scale(s)"
        ]
    if dq_axis != axis:
        return [f"{name}: weight {src} scales are on axis {dq_axis}, the output-channel axis is {axis}"]
    if np.issubdtype(weight.dtype, np.floating):
        shape = [1] * weight.ndim
        shape[axis] = channels
        worst = float(np.max(np.abs(weight / scale.reshape(shape)))) if weight.size else 0.0
        if worst > INT8_MAX + 0.5:
            return [f"{name}: weight {src} exceeds the symmetric range [-127, 127] by its scales (max {worst:.1f})"]
    return []


def _weight_values(
    dq: onnx.NodeProto, const: dict[str, np.ndarray], made_by: dict[str, onnx.NodeProto]
) -> np.ndarray | None:
    """The constant behind a DequantizeLinear (int8 initializer, or float constant -> QuantizeLinear)."""
    src = dq.input[0]
    if src in const:
        return const[src]
    q = made_by.get(src)
    if q is not None and q.op_type == "QuantizeLinear" and q.input[0] in const:
        return const[q.input[0]]
    return None
