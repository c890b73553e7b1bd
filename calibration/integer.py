"""The INT8 graph for onnxruntime's CPU provider: the gated Q/DQ graph with integer storage.

``policy.int8.onnx`` keeps float weights behind QuantizeLinear -> DequantizeLinear, the form TensorRT's
parser wants (see ``qdq.py``). onnxruntime's CPU provider runs that graph as float GEMMs plus the Q/DQ
pairs, slower than fp32. It runs its integer GEMM (``QGemm``, U8S8/S8S8 kernels with VNNI where the CPU
has it) only where its QDQ selectors match (onnxruntime ``qdq_selectors.cc``), so this graph differs in
storage, not in calibration:

- weights are int8 initializers behind DequantizeLinear (the QuantizeLinear is applied here, with the
  same per-channel scales);
- each Gemm bias is an int32 initializer behind DequantizeLinear, scaled by input scale x weight scale
  (the selector wants all three Gemm inputs from DequantizeLinear; TensorRT would reject this);
- a ReLU folds into the QuantizeLinear after it only when the zero point is the bottom of the range, so
  a ReLU output is stored as uint8 with zero point 0 and scale ``amax / 255``: the same calibrated amax,
  with twice the resolution of symmetric int8 (which cannot use its negative half there).

The result passes the same accuracy gate (action error) before it is written. A layer the gate kept in
float has no Q/DQ and is left as it is.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import attr, constants, producers
from .qdq import INT8_MAX, float_layers_of, set_metadata

UINT8_MAX = 255.0
SCHEME = "int8-integer-cpu"


def integer_graph(qdq: onnx.ModelProto) -> onnx.ModelProto:
    """``qdq`` (a ``quantize_model`` result) with int8 weights, int32 biases and uint8 ReLU outputs."""
    model = copy.deepcopy(qdq)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    made = producers(model)
    _unsigned_relu_outputs(graph, inits, made)
    const = constants(model)
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] in inits:  # a weight: quantise it here
            weight, scale = const[node.input[0]], const[node.input[1]]
            shape = [1] * weight.ndim
            shape[attr(node, "axis", 1) % weight.ndim] = -1
            q = np.clip(np.rint(weight / scale.reshape(shape)), -INT8_MAX, INT8_MAX).astype(np.int8)
            graph.initializer.append(numpy_helper.from_array(q, node.output[0]))
            continue
        if node.op_type == "Gemm" and len(node.input) == 3 and node.input[2] in inits:
            nodes.extend(_int32_bias(graph, node, const, made))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    set_metadata(model, {"float_layers": float_layers_of(qdq) or [], "scheme": SCHEME})
    onnx.checker.check_model(model)
    return model


def _unsigned_relu_outputs(
    graph: onnx.GraphProto, inits: dict[str, onnx.TensorProto], made: dict[str, onnx.NodeProto]
) -> None:
    """Re-express the Q/DQ after each ReLU as uint8, zero point 0, scale amax / 255 (amax = scale x 127)."""
    for node in graph.node:
        source = made.get(node.input[0]) if node.op_type == "QuantizeLinear" else None
        if source is None or source.op_type != "Relu":
            continue
        scale, zero = inits[node.input[1]], inits[node.input[2]]
        amax = float(numpy_helper.to_array(scale)) * INT8_MAX
        scale.CopyFrom(numpy_helper.from_array(np.array(amax / UINT8_MAX, np.float32), scale.name))
        zero.CopyFrom(numpy_helper.from_array(np.array(0, np.uint8), zero.name))


def _int32_bias(
    graph: onnx.GraphProto, gemm: onnx.NodeProto, const: dict[str, np.ndarray], made: dict[str, onnx.NodeProto]
) -> list[onnx.NodeProto]:
    """Replace ``gemm``'s float bias by int32 behind a DequantizeLinear, when both products are quantised."""
    dq_a, dq_b = made.get(gemm.input[0]), made.get(gemm.input[1])
    if dq_a is None or dq_b is None or dq_a.op_type != "DequantizeLinear" or dq_b.op_type != "DequantizeLinear":
        return []
    scale_a = float(np.asarray(const[dq_a.input[1]]).reshape(()))
    scale_b = np.asarray(const[dq_b.input[1]], np.float32).reshape(-1)
    bias = np.asarray(const[gemm.input[2]], np.float32)
    scale = (np.float32(scale_a) * scale_b).astype(np.float32)
    if scale.size == 1:
        scale = scale.reshape(())
    tag = f"{gemm.input[2]}_int32"
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.rint(bias / scale).astype(np.int32), tag),
            numpy_helper.from_array(scale, f"{tag}_scale"),
            numpy_helper.from_array(np.zeros(scale.shape, np.int32), f"{tag}_zero_point"),
        ]
    )
    dq = helper.make_node(
        "DequantizeLinear", [tag, f"{tag}_scale", f"{tag}_zero_point"], [f"{tag}_dequantized"], name=f"{tag}_DQ"
    )
    if scale.ndim:
        dq.attribute.append(helper.make_attribute("axis", 0))
    gemm.input[2] = dq.output[0]
    return [dq]
