"""Pushes an actor weight set into every loaded inference backend, re-quantising it for INT8 first.

fp32 / fp16 backends take the actor tensors as they are (``Backend.swap_weights``: a rebuilt onnxruntime
session, the torch module, or a TensorRT refit). An INT8 backend takes the *re-quantised* set: the fp32
graph with the new weights goes through ``calibration.qdq.quantize_model`` with the bundle's activation
ranges (manifest ``calibration.amax``) and the layers the gate kept in float (the int8 graph's metadata),
which recomputes the per-channel weight scales from the new weights; the resulting float initializers
(weights, biases and per-channel weight scales, same names as in ``policy.int8.onnx``) are what the
backend installs; the per-tensor activation scales are the bundle's and never change. Where the bundle
has the integer graph for onnxruntime's CPU provider (``policy.int8-cpu.onnx``), the same Q/DQ model goes
through ``calibration.integer.integer_graph`` and its int8 weights, int32 biases and scales join the set
(each backend takes the names its graph has). Before that the gate's action-error criterion
(``calibration.gate.action_errors`` <= ``MAX_MEAN_ERROR_FRAC`` of the range) is re-checked on recent
states, each int8 graph vs fp32 of the same new weights; a candidate that fails is not installed
anywhere, so every backend keeps serving the same weights. No torch here (``--resume`` alone).

Where it runs: a candidate's :class:`WeightSets` are made in the learner process (``learner_process.py``;
re-quantising holds an interpreter lock for 1-13 ms and opens onnxruntime sessions), and the control
process only installs them (:meth:`WeightSwapper.install`). The control process re-quantises only before
the loop starts (:meth:`WeightSwapper.prepare`: the bundle's weights, ``--resume``); a rollback and the
restore after a failure reinstall the sets kept from when those weights went live, which passed the check
then, so nothing is re-quantised on the way back either.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FP32, INT8, ONNX_CPU_KIND
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.backends.base import Backend


class Requantized(NamedTuple):
    initializers: dict[str, np.ndarray]
    mean_error_frac: float
    max_error_frac: float
    passed: bool
    seconds: float

    def facts(self) -> dict[str, Any]:
        """The check's result as telemetry reports them (JSON-ready)."""
        return {
            "mean_action_error_frac": self.mean_error_frac,
            "max_action_error_frac": self.max_error_frac,
            "passed": self.passed,
            "requantize_s": round(self.seconds, 6),
        }


class Int8Requantizer:
    """Q/DQ for new actor weights with the bundle's calibration, and the gate's action-error check."""

    def __init__(self, bundle: Bundle) -> None:
        import onnx

        from sac_edge.calibration.qdq import float_layers_of

        fp32, int8 = bundle.onnx(FP32), bundle.onnx(INT8)
        amax = (bundle.manifest.get("calibration") or {}).get("amax")
        if fp32 is None or int8 is None or not isinstance(amax, dict):
            raise SacEdgeError(
                f"{bundle.path}: swapping weights into int8 needs policy.onnx, policy.int8.onnx and the calibration "
                "ranges (manifest calibration.amax) that sac-export --int8 writes; re-export or serve fp32"
            )
        self.model = onnx.load_from_string(bundle.read(fp32))
        int8_model = onnx.load_from_string(bundle.read(int8))
        self.float_layers = frozenset(float_layers_of(int8_model) or ())
        self.amax = {str(k): float(v) for k, v in amax.items()}
        self.spec = bundle.spec
        self.integer = bool(bundle.files(ONNX_CPU_KIND, INT8))

    def requantize(self, weights: Mapping[str, np.ndarray], states: np.ndarray | None) -> Requantized:
        """Q/DQ initializers for ``weights``; checked on ``states`` (None: not checked, reported as passed)."""
        import onnx
        from onnx import numpy_helper

        from sac_edge.calibration.gate import MAX_MEAN_ERROR_FRAC, action_errors
        from sac_edge.calibration.integer import integer_graph
        from sac_edge.calibration.qdq import quantize_model
        from sac_edge.calibration.session import OnnxPolicy

        start = time.perf_counter()
        model = copy.deepcopy(self.model)
        for init in model.graph.initializer:
            if init.name in weights:
                init.CopyFrom(numpy_helper.from_array(np.asarray(weights[init.name], np.float32), init.name))
        graphs = [quantize_model(model, self.amax, float_layers=self.float_layers)]
        if self.integer:
            graphs.append(integer_graph(graphs[0]))
        swappable = (onnx.TensorProto.FLOAT, onnx.TensorProto.INT8, onnx.TensorProto.INT32)
        initializers = {  # 0-d values are activation scales, zero points and constants, fixed by the bundle
            init.name: value
            for graph in graphs
            for init in graph.graph.initializer
            if init.data_type in swappable and (value := numpy_helper.to_array(init)).ndim > 0
        }
        if states is None or len(states) == 0:
            return Requantized(initializers, math.nan, math.nan, True, time.perf_counter() - start)
        reference = OnnxPolicy(model)
        errors = [
            action_errors(reference, OnnxPolicy(g), states, self.spec.action_low, self.spec.action_high)[2:]
            for g in graphs
        ]
        max_frac, mean_frac = max(e[0] for e in errors), max(e[1] for e in errors)
        passed = bool(np.isfinite(mean_frac) and mean_frac <= MAX_MEAN_ERROR_FRAC)
        return Requantized(initializers, mean_frac, max_frac, passed, time.perf_counter() - start)


class WeightSets(NamedTuple):
    """One actor weight set as each backend takes it: the actor tensors (fp32 / fp16 backends) and, where
    an int8 backend is loaded, the re-quantised initializers and the check's result (``int8_facts``)."""

    actor: dict[str, np.ndarray]
    int8: dict[str, np.ndarray]
    int8_facts: dict[str, Any] | None

    @property
    def passed(self) -> bool:
        """False when the int8 re-check failed: such a set is installed nowhere."""
        return self.int8_facts is None or bool(self.int8_facts["passed"])

    def for_precision(self, precision: str) -> dict[str, np.ndarray]:
        return self.int8 if precision == INT8 else self.actor


def weight_sets(
    requantizer: Int8Requantizer | None, actor: Mapping[str, np.ndarray], states: np.ndarray | None
) -> WeightSets:
    """The sets for ``actor``, re-quantised when there is a ``requantizer`` and checked on ``states``
    (None: not checked, for weights that passed when they went live)."""
    if requantizer is None:
        return WeightSets(dict(actor), {}, None)
    req = requantizer.requantize(actor, states)
    return WeightSets(dict(actor), req.initializers if req.passed else {}, req.facts())


class SwapOutcome(NamedTuple):
    """What one install did: per-precision seconds, the int8 check, and whether it went live."""

    live: bool
    seconds: dict[str, float]
    int8: dict[str, Any] | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class WeightSwapper:
    """Installs weight sets into each backend of ``backends`` (the loop's precision -> backend map)."""

    def __init__(
        self, backends: Mapping[str, Backend], bundle: Bundle, listeners: Sequence[Callable[[], None]] = ()
    ) -> None:
        self.backends = backends
        self.bundle = bundle  # what the resumed weights are checked against (``promotion.check_complete``)
        self.requantizer = Int8Requantizer(bundle) if INT8 in backends else None
        self.expected: dict[str, int] = {}
        self.listeners = tuple(listeners)
        """Called (on the installing thread) after each install that went live everywhere: the shield's
        ramp after a weight swap."""

    def prepare(self, actor: Mapping[str, np.ndarray], states: np.ndarray | None) -> WeightSets:
        """Re-quantise ``actor`` in this process (before the loop starts only; see the module docstring)."""
        return weight_sets(self.requantizer, actor, states)

    def warm_up(self, sets: WeightSets) -> None:
        """Make the swap path's memory resident before the learner's sizing reads the baseline.

        A rebuilding backend keeps the serving and the retired weight set (two onnxruntime sessions or
        TensorRT engines); an in-place one built both at start. Measured on x86 onnxruntime with fp32 + int8
        loaded, the second generations came to a good part of ~20 MiB that the first candidates would
        otherwise add after the sizing had been chosen (a tight --mem-budget-mb then ended over budget). So:
        one more install of the sets already serving. (The int8 re-check's sessions are the learner
        process's, measured there.)
        """
        self.install(sets)

    def install(self, sets: WeightSets) -> SwapOutcome:
        """Install ``sets`` everywhere, or nowhere when they failed the int8 re-check."""
        if not sets.passed:
            return SwapOutcome(False, {}, sets.int8_facts, "int8 re-quantisation failed the gate's action-error check")
        seconds = {}
        for precision, backend in self.backends.items():
            report = backend.swap_weights(sets.for_precision(precision))
            want = self.expected.setdefault(precision, report.applied)
            if report.applied == 0 or report.applied != want:
                raise SacEdgeError(
                    f"{backend.name}/{precision}: swap installed {report.applied} tensors, expected {want}; "
                    "the bundle's graph does not name its weights like the learner"
                )
            seconds[precision] = round(report.seconds, 6)
        for listener in self.listeners:
            listener()
        return SwapOutcome(True, seconds, sets.int8_facts, "installed")
