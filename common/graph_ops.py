"""The ops a policy graph may contain, enforced where a graph is written (``sac-export``) and where it is
opened (``sac-edge``).

A bundle's ``policy*.onnx`` is untrusted code for the runtime that executes it: a ``Loop`` of 10^15
iterations loads fine and never returns, a custom-domain op runs whatever kernel its library brings. The
allow-list is the TensorRT 8.5 set export already restricts itself to, so nothing sac-export writes is
refused; the manifest's ``onnx.ops`` (what export wrote for ``policy.onnx``) is compared as well, so a graph
swapped in under a re-hashed manifest still has to match what the export said it wrote.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .bundle_format import FP32
from .errors import SacEdgeError

# Ops a policy graph (fp32 or Q/DQ) may contain: each is "Y" in onnx-tensorrt release/8.5-GA
# docs/operators.md (IsInf, for one, is "N" there).
TENSORRT_85_OPS = frozenset(
    {
        "Add", "Cast", "Clip", "Constant", "DequantizeLinear", "Div", "Equal", "Gemm", "Identity", "IsNaN",
        "MatMul", "Max", "Min", "Mul", "Not", "QuantizeLinear", "Relu", "Reshape", "Sigmoid", "Softplus",
        "Sub", "Tanh", "Where",
    }
)  # fmt: skip
#: What a graph of another precision adds to the fp32 graph's ops (casts of an fp16 graph, Q/DQ of int8).
PRECISION_OPS = frozenset({"Cast", "QuantizeLinear", "DequantizeLinear"})
STANDARD_DOMAINS = ("", "ai.onnx")


def graph_ops(model: Any) -> set[str]:
    """Every op of an ``onnx.ModelProto``, subgraphs (a ``Loop``'s or ``If``'s body) included; an op of another
    domain as ``domain:Op``."""
    return set(_ops(model.graph.node))


def _ops(nodes: Iterable[Any]) -> Iterator[str]:
    for node in nodes:
        yield node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}:{node.op_type}"
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _ops(attr.g.node)
            for graph in attr.graphs:
                yield from _ops(graph.node)


def check_graph_ops(model: Any, name: str, precision: str, listed: object) -> None:
    """Refuse (one ``SacEdgeError`` line) the parsed ONNX ``model`` (bundle file ``name``) when it uses an op
    outside ``TENSORRT_85_OPS``, a model-local function, or (``listed``: the manifest's ``onnx.ops``, when it
    is a list) an op the manifest does not list: the fp32 graph none, a graph of another precision none but
    ``PRECISION_OPS``."""
    fix = "re-export the bundle with sac-export"
    if len(model.functions):
        raise SacEdgeError(f"{name}: the graph defines its own functions, which no sac-export graph has; {fix}")
    ops = graph_ops(model)
    outside = sorted(ops - TENSORRT_85_OPS)
    if outside:
        raise SacEdgeError(
            f"{name}: the graph uses ops outside the TensorRT 8.5 set sac-export allows ({', '.join(outside)}); {fix}"
        )
    if isinstance(listed, list):
        allowed = set(map(str, listed)) | (PRECISION_OPS if precision != FP32 else set())
        unlisted = sorted(ops - allowed)
        if unlisted:
            raise SacEdgeError(
                f"{name}: the graph uses ops the manifest does not list for it ({', '.join(unlisted)}); {fix}"
            )
