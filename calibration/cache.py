"""``calib.cache``'s content: which tensors get an INT8 scale, and the scales (the file format, shared with
the engine builder, is ``sac_edge.common.trt.calib_cache``).

Tensors are named as TensorRT's ONNX parser names them: the ONNX tensor names of ``policy.onnx``. Written
from the same amax as the Q/DQ model: the data inputs of every quantised MatMul/Gemm, plus the layer's
output when it feeds another quantised input directly or through a Relu (TensorRT needs a range on both
sides of a layer to run it in INT8 and fuses Gemm+Relu). Normalisation ops before the first layer and the
last layer's output (tanh input) get no scale, so TensorRT keeps them in higher precision, as the Q/DQ
model does. Layers kept in float get no scales at all. Whether the layers then really run INT8 is recorded
from the engine inspector at build time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import onnx

from sac_edge.common.errors import SacEdgeError

from .graph import constants, consumers, layer_name, linear_inputs, linear_nodes
from .qdq import activation_scale


def cache_tensors(model: onnx.ModelProto, float_layers: Collection[str] = ()) -> list[str]:
    """The activation tensors ``calib.cache`` gives a scale (see the module docstring), in graph order."""
    const = constants(model)
    users = consumers(model)
    quantised = [n for n in linear_nodes(model) if layer_name(n) not in float_layers]
    inputs = [name for n in quantised for name in linear_inputs(n, const).data if name not in const]
    wanted = set(inputs)
    names = list(inputs)
    for node in quantised:
        out = node.output[0]
        readers = users.get(out, [])
        direct = out in wanted
        via_relu = bool(readers) and all(r.op_type == "Relu" and r.output[0] in wanted for r in readers)
        if direct or via_relu:
            names.append(out)
    return list(dict.fromkeys(names))


def cache_scales(
    model: onnx.ModelProto, amax: Mapping[str, float], float_layers: Collection[str] = ()
) -> dict[str, float]:
    """Scale (amax / 127, as in the Q/DQ model) per cached tensor."""
    missing = [n for n in cache_tensors(model, float_layers) if n not in amax]
    if missing:
        raise SacEdgeError(f"no calibration range for cache tensors: {', '.join(missing)}")
    return {n: float(activation_scale(amax[n])) for n in cache_tensors(model, float_layers)}
