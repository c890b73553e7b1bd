"""The deployment policy (``InferencePolicy``: normalise -> actor mean -> tanh -> scale) as ``policy.onnx``.

Choices, each for the devices the bundle targets:

- Opset 17: the highest TensorRT 8.5 (JetPack 5) parses ("TensorRT 8.5 supports operators up to Opset 17",
  onnx-tensorrt release/8.5-GA docs/operators.md); TensorRT 10 reads opsets 9..20; per-channel Q/DQ needs
  >= 13. IR version 8 is the one ONNX 1.12 (that parser's onnx) writes for opset 17.
- The TorchScript exporter (``dynamo=False``): it still works in torch 2.13 (with a deprecation warning)
  and needs no extra package; the dynamo exporter needs onnxscript, which is not a dependency.
- onnxslim for simplification: it constant-folds and drops identity/dead nodes while keeping standard ONNX
  ops at the same opset. onnxruntime's offline optimisation was the alternative, but beyond its basic level
  it writes ORT-only fused ops (com.microsoft domain) that TensorRT cannot parse.
- Every op is checked against the TensorRT 8.5 support matrix (``TENSORRT_85_OPS``): ``nan_to_num``
  would export IsInf, which 8.5 lacks, hence IsNaN + Where + Clip in ``InferencePolicy.forward``.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import NamedTuple

import onnx
import torch
from torch import nn

from sac_edge.common.atomic import atomic_write_bytes
from sac_edge.common.errors import InternalError
from sac_edge.common.graph_ops import TENSORRT_85_OPS

OPSET = 17
IR_VERSION = 8
INPUT = "obs"
OUTPUT = "action"
BATCH_DIM = "batch"


class OnnxInfo(NamedTuple):
    """What was written: the file, its opset and the ops it uses (for the manifest and the checks)."""

    path: Path
    opset: int
    ops: tuple[str, ...]
    initializers: tuple[str, ...]  # names TensorRT's Refitter addresses weights by


def export_policy(policy: nn.Module, obs_dim: int, path: Path) -> OnnxInfo:
    """Export ``policy`` (raw obs ``[batch, obs_dim]`` -> action) to ``path``: dynamic batch, simplified,
    fully checked and restricted to TensorRT 8.5 ops."""
    policy = policy.eval()
    example = torch.zeros(1, obs_dim, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        raw = str(Path(tmp) / "raw.onnx")
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            policy,
            (example,),
            raw,
            dynamo=False,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: BATCH_DIM}, OUTPUT: {0: BATCH_DIM}},
            opset_version=OPSET,
            do_constant_folding=True,
            export_params=True,
        )
        model = onnx.load(raw)
    model = simplify(model)
    check_policy_graph(model, obs_dim)
    atomic_write_bytes(path, model.SerializeToString())
    return describe(model, path)


def simplify(model: onnx.ModelProto) -> onnx.ModelProto:
    """Constant folding and dead/identity-node removal with onnxslim, at the same opset and IR version."""
    import onnxslim

    slim = onnxslim.slim(model)
    if not isinstance(slim, onnx.ModelProto):
        raise InternalError("onnxslim returned no model")
    slim.ir_version = min(slim.ir_version, IR_VERSION)
    slim.producer_name = "sac-edge"
    return slim


def check_policy_graph(model: onnx.ModelProto, obs_dim: int) -> None:
    """Full ONNX checks, the ``obs``/``action`` interface with a symbolic batch, and TensorRT 8.5 ops only."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise InternalError(f"exported ONNX fails onnx.checker: {str(err).splitlines()[0]}") from None
    inputs, outputs = list(model.graph.input), list(model.graph.output)
    if [i.name for i in inputs] != [INPUT] or [o.name for o in outputs] != [OUTPUT]:
        raise InternalError(f"exported ONNX has inputs {[i.name for i in inputs]}, outputs {[o.name for o in outputs]}")
    dims = inputs[0].type.tensor_type.shape.dim
    if len(dims) != 2 or dims[0].dim_param != BATCH_DIM or dims[1].dim_value != obs_dim:
        raise InternalError(f"exported ONNX input is not [{BATCH_DIM}, {obs_dim}]")
    check_tensorrt_ops(model)


def check_tensorrt_ops(model: onnx.ModelProto) -> None:
    """Fail on any op outside ``TENSORRT_85_OPS`` (the graph would not parse on JetPack 5)."""
    bad = sorted(
        {n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")} | (ops(model) - TENSORRT_85_OPS)
    )
    if bad:
        raise InternalError(f"ONNX graph uses ops TensorRT 8.5 cannot parse: {', '.join(bad)}")


def ops(model: onnx.ModelProto) -> set[str]:
    """The op types a graph uses."""
    return {n.op_type for n in model.graph.node}


def describe(model: onnx.ModelProto, path: Path) -> OnnxInfo:
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return OnnxInfo(path, opset, tuple(sorted(ops(model))), tuple(i.name for i in model.graph.initializer))
