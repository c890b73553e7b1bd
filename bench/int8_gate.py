"""The INT8 engine gate's margin: how far correct int8 kernels of one Q/DQ model differ, against the rule.

An int8 engine is judged against the Q/DQ graph it implements (``parity_gate.INT8_KERNEL_FRAC``, a mean
fraction of the action range) and against fp32 within the Q/DQ graph's own error plus that margin. For
each bundle (exported with ``sac-export --int8``) this runs, on its held-out parity states, every int8
implementation of the bundle's Q/DQ model that can run here and measures each against the gate's
reference (onnxruntime's CPU provider with its default graph optimisations, which fuse Q/DQ pairs into
integer kernels):

- onnxruntime with graph optimisations off: every QuantizeLinear/DequantizeLinear evaluated on its own
  in float, the other end from the fused integer kernels;
- onnx's reference evaluator (numpy), a third, independent implementation of the operators;
- the reference with every float op's output rounded to fp16 (10 mantissa bits, as TF32's): what an
  engine does that runs the unquantised ops in fp16 or its float GEMMs in TF32 (Orin's default).

It also prints the old rule's headroom (the Q/DQ graph against fp32, the error the device used to
compare with the 1% accuracy-gate limit) and a stale-scale engine (one activation scale doubled, the
fault the gate exists for), judged by both rules.

    python bench/int8_gate.py --bundles runs/pendulum-bundle,runs/cheetah-bundle

Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from sac_edge.calibration.gate import MAX_MEAN_ERROR_FRAC
from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.config import parse_config
from sac_edge.common.table import format_table
from sac_edge.edge_runtime.backends.parity_gate import INT8_KERNEL_FRAC, gate_states, judge, reference_actions


@dataclass(frozen=True)
class BenchConfig:
    bundles: tuple[str, ...] = field(
        default=(), metadata={"help": "bundles exported with sac-export --int8 (comma-separated)"}
    )


def _session(model: onnx.ModelProto, optimise: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, states: np.ndarray) -> np.ndarray:
    return np.asarray(session.run(None, {session.get_inputs()[0].name: states})[0], np.float32)


def _reference_evaluator(model: onnx.ModelProto, states: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    # the evaluator implements QuantizeLinear/DequantizeLinear from opset 19, whose int8 semantics are
    # opset 13's; no other op of the graph changed meaning between them
    lifted = onnx.ModelProto()
    lifted.CopyFrom(model)
    for opset in lifted.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, 19)
    evaluator = ReferenceEvaluator(lifted)
    name = model.graph.input[0].name
    outputs: list[Any] = list(evaluator.run(None, {name: states}))
    return np.asarray(outputs[0], np.float32)


def _rounded_between_ops(model: onnx.ModelProto) -> onnx.ModelProto:
    """The Q/DQ graph with each float output of every op but Q/DQ rounded through fp16 and back."""
    from onnx import TensorProto, helper

    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {
        v.name
        for v in [*inferred.graph.value_info, *inferred.graph.output]
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    nodes = []
    for node in rounded.graph.node:
        nodes.append(node)
        if node.op_type in ("QuantizeLinear", "DequantizeLinear", "Constant"):
            continue
        for i, name in enumerate(node.output):
            if name in floats:
                node.output[i] = f"{name}__exact"
                nodes.append(helper.make_node("Cast", [node.output[i]], [f"{name}__half"], to=TensorProto.FLOAT16))
                nodes.append(helper.make_node("Cast", [f"{name}__half"], [name], to=TensorProto.FLOAT))
    del rounded.graph.node[:]
    rounded.graph.node.extend(nodes)
    return rounded


def _stale_scale(model: onnx.ModelProto) -> onnx.ModelProto:
    """The Q/DQ graph with the first activation QuantizeLinear's scale doubled (both of its Q/DQ pair)."""
    from onnx import numpy_helper

    stale = onnx.ModelProto()
    stale.CopyFrom(model)
    inits = {init.name: init for init in stale.graph.initializer}
    first = next(n for n in stale.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits)
    scale = inits[first.input[1]]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, scale.name))
    return stale


def measure(bundle: Bundle) -> dict[str, Any]:
    int8 = bundle.onnx("int8")
    if int8 is None:
        raise SystemExit(f"{bundle.path}: no policy.int8.onnx; export it with sac-export --int8")
    states, source = gate_states(bundle)
    model = onnx.load_from_string(bundle.read(int8))
    fp32 = reference_actions(bundle, states)
    qdq = reference_actions(bundle, states, graph="int8")
    kernels = {
        "onnxruntime, optimisations off": _run(_session(model, optimise=False), states),
        "onnx reference evaluator": _reference_evaluator(model, states),
        "fp16 rounding after every float op": _run(_session(_rounded_between_ops(model), True), states),
        "stale activation scale (x2)": _run(_session(_stale_scale(model), optimise=True), states),
    }
    rows = []
    for name, actions in kernels.items():
        new = judge(actions, fp32, bundle, "bench", "int8", "bench", source, qdq)
        old = judge(actions, fp32, bundle, "bench", "int8", "bench", source)
        rows.append(
            {
                "kernel": name,
                "vs_qdq_mean_frac": new.value,
                "vs_qdq_max_abs": float(np.abs(actions - qdq).max()),
                "vs_fp32_mean_frac": new.fp32_value,
                "new_rule_passed": new.passed,
                "old_rule_passed": old.passed,
            }
        )
    reference = judge(qdq, fp32, bundle, "bench", "int8", "bench", source, qdq)
    return {
        "bundle": str(bundle.path),
        "env": bundle.spec.env_id,
        "states": len(states),
        "qdq_vs_fp32_mean_frac": reference.reference_fp32_value,
        "old_limit": MAX_MEAN_ERROR_FRAC,
        "kernel_limit": INT8_KERNEL_FRAC,
        "fp32_limit": reference.fp32_limit,
        "kernels": rows,
    }


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(BenchConfig, argv, "bench/int8_gate.py", __doc__.splitlines()[0])
    if not cfg.bundles:
        print("bench/int8_gate.py: error: --bundles is required (bundles exported with --int8)", file=sys.stderr)
        return 2
    results = [measure(open_bundle(path)) for path in cfg.bundles]
    table = []
    for res in results:
        table.append([res["env"], "Q/DQ graph (the reference)", "0", f"{res['qdq_vs_fp32_mean_frac']:.4%}", "-", "-"])
        for row in res["kernels"]:
            table.append(
                [
                    res["env"],
                    row["kernel"],
                    f"{row['vs_qdq_mean_frac']:.4%}",
                    f"{row['vs_fp32_mean_frac']:.4%}",
                    "pass" if row["new_rule_passed"] else "FAIL",
                    "pass" if row["old_rule_passed"] else "FAIL",
                ]
            )
    headers = ["env", "int8 implementation", "vs Q/DQ (mean/range)", "vs fp32 (mean/range)", "new rule", "old rule"]
    print(format_table(table, headers))
    print(
        f"new rule: vs Q/DQ <= {INT8_KERNEL_FRAC:.2%} and vs fp32 <= the Q/DQ graph's figure + {INT8_KERNEL_FRAC:.2%}; "
        f"old rule: vs fp32 <= {MAX_MEAN_ERROR_FRAC:.0%}"
    )
    print(json.dumps({"bench": "int8_gate", "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
