"""Explicit Q/DQ insertion: the fp32 policy graph -> ``policy.int8.onnx`` that TensorRT 10 builds as is.

The rules (onnx-tensorrt operators.md, TensorRT "Explicit Quantization"; ../shared/reference/edge-facts.md):
symmetric int8 with int8 zero points equal to 0, per-tensor scales on activations, per-channel scales on
the output-channel axis of weights (opset >= 13 for ``axis``), Q/DQ on both multiplied inputs of every
MatMul/Gemm, biases left float (TensorRT rejects int32 bias Q/DQ).

Weights are kept as float initializers behind QuantizeLinear -> DequantizeLinear rather than stored as
int8 initializers + DequantizeLinear. TensorRT quantises float weights itself with the Q scale at build time
("Quantized Weights" in the TensorRT explicit-quantization guide), and this is the form TensorRT 8.x also
parses: its ONNX importer wants a DequantizeLinear input of a float (activation) type, which an int8
initializer is not (kevinch-nv in onnx/onnx-tensorrt#850). Float weights also keep the initializer names
of ``policy.onnx``, which is what TensorRT's Refitter addresses when on-device fine-tuning swaps weights.
The cost, 4 bytes per weight in the file instead of 1, is nothing for an MLP policy.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from sac_edge.common.errors import SacEdgeError

from .graph import MIN_OPSET, constants, default_opset, layer_name, linear_inputs, linear_nodes

QUANT_METADATA = "sac_edge.quantization"  # metadata_props key: JSON with the layers kept in float
INT8_MAX = 127.0
MIN_AMAX = 1e-12  # an all-zero tensor or channel still gets a positive scale (TensorRT requires one)


def activation_scale(amax: float) -> np.float32:
    """Per-tensor symmetric scale: amax maps to 127."""
    return np.float32(max(float(amax), MIN_AMAX) / INT8_MAX)


def weight_scales(weight: np.ndarray, axis: int) -> np.ndarray:
    """Per-output-channel symmetric scales ``max|w| / 127`` along ``axis`` (TensorRT's weight recipe)."""
    reduce = tuple(d for d in range(weight.ndim) if d != axis % weight.ndim)
    amax = np.abs(weight).max(axis=reduce)
    return (np.maximum(amax, MIN_AMAX) / INT8_MAX).astype(np.float32)


def quantizable_tensors(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Activation tensors that Q/DQ would quantise, mapped to the layers reading them."""
    const = constants(model)
    out: dict[str, list[str]] = {}
    for node in linear_nodes(model):
        for name in linear_inputs(node, const).data:
            if name not in const:
                out.setdefault(name, []).append(layer_name(node))
    return out


def quantize_model(
    model: onnx.ModelProto, amax: Mapping[str, float], *, float_layers: Collection[str] = ()
) -> onnx.ModelProto:
    """A copy of ``model`` with Q/DQ on every MatMul/Gemm input except the layers in ``float_layers``.

    ``amax`` gives the activation range per quantised tensor (from ``calibrators.compute_amax``); weight
    scales come from the weights. Q/DQ pairs on one tensor are shared by all layers reading it.
    """
    if default_opset(model) < MIN_OPSET:
        raise SacEdgeError(
            f"the ONNX model has opset {default_opset(model)}; Q/DQ with per-channel weights needs "
            f"opset >= {MIN_OPSET} (re-export with a newer opset)"
        )
    out = copy.deepcopy(model)
    layers = linear_nodes(out)
    names = {layer_name(n) for n in layers}
    unknown = sorted(set(float_layers) - names)
    if unknown:
        raise SacEdgeError(f"layers to keep in float are not MatMul/Gemm nodes of the model: {', '.join(unknown)}")
    for node in layers:
        node.name = layer_name(node)
    const = constants(out)
    pending: dict[int, list[onnx.NodeProto]] = {}  # id(consumer) -> Q/DQ nodes to place before it
    made: dict[tuple[str, int | None], str] = {}  # (tensor, axis) -> dequantised name
    for node in layers:
        if node.name in float_layers:
            continue
        inputs = linear_inputs(node, const)
        for index, name in enumerate(node.input[:2]):
            axis = inputs.weight_axis if name == inputs.weight else None
            key = (name, axis)
            if key not in made:
                scale: np.ndarray
                if axis is not None:
                    scale = weight_scales(const[name], axis)
                elif name in const:
                    scale = np.asarray(activation_scale(float(np.abs(const[name]).max())))
                elif name in amax:
                    scale = np.asarray(activation_scale(amax[name]))
                else:
                    raise SacEdgeError(f"no calibration range for tensor {name!r} (input of {node.name})")
                made[key] = _add_qdq(out, name, scale, axis, pending.setdefault(id(node), []))
            node.input[index] = made[key]
    ordered: list[onnx.NodeProto] = []
    for node in out.graph.node:
        ordered.extend(pending.get(id(node), []))
        ordered.append(node)
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    set_metadata(out, {"float_layers": sorted(float_layers), "scheme": "int8-symmetric-qdq"})
    onnx.checker.check_model(out)
    return out


def _add_qdq(model: onnx.ModelProto, name: str, scale: np.ndarray, axis: int | None, sink: list[onnx.NodeProto]) -> str:
    """Add ``name -> QuantizeLinear -> DequantizeLinear`` with int8 zero points of 0; return the DQ output."""
    tag = f"{name}_w{axis}" if axis is not None else name
    scale_name, zp_name = f"{tag}_scale", f"{tag}_zero_point"
    scale_arr = np.asarray(scale, dtype=np.float32)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(scale_arr, scale_name),
            numpy_helper.from_array(np.zeros(scale_arr.shape, np.int8), zp_name),
        ]
    )
    q_out, dq_out = f"{tag}_quantized", f"{tag}_dequantized"
    q = helper.make_node("QuantizeLinear", [name, scale_name, zp_name], [q_out], name=f"{tag}_Q")
    dq = helper.make_node("DequantizeLinear", [q_out, scale_name, zp_name], [dq_out], name=f"{tag}_DQ")
    if axis is not None:
        for node in (q, dq):
            node.attribute.append(helper.make_attribute("axis", axis))
    sink.extend([q, dq])
    return dq_out


def set_metadata(model: onnx.ModelProto, value: dict[str, object]) -> None:
    """Record sac-edge's quantisation facts (the float layers, the scheme) in the model's metadata."""
    props = {p.key: p.value for p in model.metadata_props}
    helper.set_model_props(model, {**props, QUANT_METADATA: json.dumps(value)})  # replaces all props


def float_layers_of(model: onnx.ModelProto) -> list[str] | None:
    """The layers a Q/DQ model declares as kept in float (None when it carries no sac-edge metadata)."""
    for prop in model.metadata_props:
        if prop.key == QUANT_METADATA:
            try:
                return [str(x) for x in json.loads(prop.value).get("float_layers", [])]
            except (json.JSONDecodeError, AttributeError):
                return None
    return None
