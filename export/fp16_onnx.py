"""``policy.fp16.onnx``: the policy with fp16 weights and compute and fp32 ``obs``/``action``.

TensorRT 11 builds only strongly typed networks: the precision of every tensor comes from the graph, and
``BuilderFlag.FP16`` is gone ("Migrating from TensorRT 10.x to 11.x", NVIDIA docs, which suggest ModelOpt
AutoCast with ``keep_io_types=True``). The policy is a small float graph, so the conversion is done here
without another dependency, with the same result AutoCast's ``keep_io_types`` gives: every float
initializer and ``Constant`` becomes float16, every ``Cast`` to float casts to float16, a ``Cast`` to
float16 follows the ``obs`` input and a ``Cast`` back to float32 produces ``action``. The bundle's parity
check then compares it with the fp32 graph on the CPU (onnxruntime runs fp16 ops it has no CPU kernel for
through inserted casts, so on the CPU the check measures the fp16 weights and the fp16 tensors between
layers; the fp16 arithmetic itself is the device's, which the edge runtime's parity gate checks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sac_edge.common.atomic import atomic_write_bytes
from sac_edge.common.errors import InternalError

FP16_SUFFIX = "__fp16"


def to_fp16(model: onnx.ModelProto, input_name: str, output_name: str) -> onnx.ModelProto:
    """A copy of ``model`` computing in float16 with float32 ``input_name``/``output_name``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(_half(numpy_helper.to_array(init)), init.name))
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(numpy_helper.from_array(_half(numpy_helper.to_array(attr.t)), attr.t.name))
    half_in, half_out = input_name + FP16_SUFFIX, output_name + FP16_SUFFIX
    for node in graph.node:
        node.input[:] = [half_in if name == input_name else name for name in node.input]
        node.output[:] = [half_out if name == output_name else name for name in node.output]
    graph.node.insert(0, helper.make_node("Cast", [input_name], [half_in], to=TensorProto.FLOAT16))
    graph.node.append(helper.make_node("Cast", [half_out], [output_name], to=TensorProto.FLOAT))
    del graph.value_info[:]  # recomputed below with the new element types
    inferred = onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    onnx.checker.check_model(inferred, full_check=True)
    return inferred


def write_fp16(fp32_path: Path, path: Path, input_name: str, output_name: str) -> None:
    """Write ``path`` as the fp16 version of the graph at ``fp32_path`` (atomically)."""
    try:
        model = to_fp16(onnx.load(str(fp32_path)), input_name, output_name)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise InternalError(
            f"the fp16 graph of {fp32_path.name} is not valid ONNX: {str(err).splitlines()[0]}"
        ) from None
    atomic_write_bytes(path, model.SerializeToString())


def _half(values: np.ndarray) -> np.ndarray:
    """float32 -> float16, saturating at the fp16 range (a clamp bound of 1e9 stays a bound, not inf)."""
    limit = float(np.finfo(np.float16).max)
    return np.clip(values, -limit, limit).astype(np.float16)
