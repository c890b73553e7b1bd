"""The engine parity gate: no engine or execution-provider session serves an action it has not proven.

After every TensorRT engine build, every plan loaded from a cache, every refit or rebuild for new weights
and every onnxruntime TensorRT/CUDA session, the bundle's held-out states (``parity_states.npy``, written
by ``sac-export`` from the parity check's held-out set) go through the backend under test, both through
``act_batch`` (its own context and profile) and through ``act`` on the first rows (the serving context),
and are compared with the fp32 ONNX reference through onnxruntime's CPU provider with the same weights:

- fp32 and fp16: max abs action error <= ``common.tolerance.tolerance`` (a fraction of the action range);
- int8: judged against the INT8 model it implements, the Q/DQ graph (``policy.int8.onnx``) as
  onnxruntime's CPU provider runs it with the same weights: mean abs action error <= ``INT8_KERNEL_FRAC``
  of the range, the margin TensorRT's int8 kernels (other rounding, fusion, fp16 between layers) need.
  Its accuracy against fp32 was decided by the accuracy gate at export (or by the fine-tuner's re-check
  for swapped weights); here it must stay within the Q/DQ graph's own error on the same states plus
  that margin. Judging an int8 engine against fp32 with the gate's 1% would leave it no headroom: a
  bundle whose Q/DQ graph sits at 0.9% is refused on the device for kernel differences it is allowed.
  Every action must be finite. A bundle without the Q/DQ graph keeps the accuracy gate's rule against
  fp32 (mean <= ``MAX_MEAN_ERROR_FRAC``).

Which backends and precisions are gated is declared once per backend kind (``BackendKind.gated``) and
enforced by the registry, the one way a backend is opened: ``gate_open`` before it serves, and a
``SwapGate`` it attaches that every ``swap_weights`` passes before it publishes. A backend never runs the
gate itself, so a new kind cannot forget it.

A failure is a ``ParityError`` (a ``SacEdgeError``) whose one line names the errors; the caller does not
serve that backend (``--backend auto`` goes on to the next candidate, a cached plan is deleted) and the
errors go into the plan's sidecar, the telemetry and ``sac-edge doctor`` (``EngineParity.to_dict``).
This is the check that catches uninitialised batch outputs, stale engine caches, dropped biases and stale
INT8 scales on a real device, where the code paths cannot be run here.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FP32, INT8, PARITY_STATES_KIND
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.tolerance import tolerance

from .base import Backend, PendingSwap

ACT_ROWS = 32  # rows also sent one at a time through act (the serving context)
# The margin for int8 kernels that implement the same Q/DQ model differently, as a mean fraction of the action
# range; BENCHMARKS.md ("Edge: the INT8 engine gate") has the kernel differences it was set against.
INT8_KERNEL_FRAC = 0.002


class EngineParity(NamedTuple):
    """One gate check: what was compared, by which rule, and the verdict."""

    backend: str
    precision: str
    when: str  # "build", "cached plan", "session", "refit", "rebuild"
    states: int
    state_source: str
    max_abs: float
    mean_abs: float
    rule: str
    limit: float
    value: float
    passed: bool
    # int8 against the Q/DQ reference: the engine's and the Q/DQ graph's mean error / range against fp32,
    # and the engine's limit (the Q/DQ graph's error plus INT8_KERNEL_FRAC); None for other precisions
    fp32_value: float | None = None
    reference_fp32_value: float | None = None
    fp32_limit: float | None = None

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        against_fp32 = ""
        if self.fp32_value is not None and self.fp32_limit is not None:
            against_fp32 = (
                f"; against fp32 {self.fp32_value:.3g} vs limit {self.fp32_limit:.3g} "
                f"(the Q/DQ graph's {self.reference_fp32_value:.3g} + {INT8_KERNEL_FRAC:g})"
            )
        return (
            f"parity gate {verdict} for {self.backend}/{self.precision} ({self.when}): {self.rule} "
            f"{self.value:.3g} vs limit {self.limit:.3g} on {self.states} held-out states "
            f"(max abs {self.max_abs:.3g}, mean abs {self.mean_abs:.3g}){against_fp32}"
        )

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class ParityError(InternalError):
    """An engine or session that disagrees with the fp32 ONNX (exit 1); ``parity`` holds the errors."""

    def __init__(self, parity: EngineParity, action: str) -> None:
        super().__init__(f"{parity.line()}; {action}")
        self.parity = parity


def gate_states(bundle: Bundle) -> tuple[np.ndarray, str]:
    """The bundle's held-out states, or (a bundle exported before they were kept) seeded standard-normal
    observations, labelled as such."""
    names = bundle.files(PARITY_STATES_KIND)
    if names:
        states = np.load(io.BytesIO(bundle.read(bundle.path / names[0])), allow_pickle=False)
        if states.ndim == 2 and states.shape[1] == bundle.spec.obs_dim and len(states):
            return np.ascontiguousarray(states, np.float32), names[0]
        raise SacEdgeError(f"{bundle.path / names[0]}: held-out states have shape {states.shape}; re-export the bundle")
    states = np.random.default_rng(0).standard_normal((256, bundle.spec.obs_dim)).astype(np.float32)
    return states, "seeded normal observations (the bundle has no parity_states.npy)"


def reference_actions(
    bundle: Bundle, states: np.ndarray, weights: Mapping[str, np.ndarray] | None = None, graph: str = FP32
) -> np.ndarray:
    """The actions of the bundle's ``graph`` ("fp32": ``policy.onnx``; "int8": the Q/DQ ``policy.int8.onnx``)
    on ``states`` through onnxruntime's CPU provider, with the float initializers of ``weights`` that the
    graph has (the weights a swap installed) in place of the bundle's."""
    import onnxruntime as ort

    model = bundle.onnx(graph)
    if model is None:
        raise SacEdgeError(f"{bundle.path}: {graph} graph (the parity gate's reference) is missing; re-export")
    options = ort.SessionOptions()
    values = []
    if weights:
        import onnx

        initializers = onnx.load_from_string(bundle.read(model)).graph.initializer
        names = {init.name for init in initializers if init.data_type == onnx.TensorProto.FLOAT}
        for name in sorted(names & set(weights)):
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(weights[name], np.float32))
            options.add_initializer(name, value)
            values.append(value)
    session = ort.InferenceSession(bundle.read(model), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: states})[0], np.float32)


def _mean_frac(err: np.ndarray, span: np.ndarray) -> float:
    """Mean absolute action error as a fraction of each dimension's range ``span`` (inf when any is
    non-finite)."""
    if not np.all(np.isfinite(err)):
        return math.inf
    return float((err / span).mean())


def judge(
    got: np.ndarray,
    want: np.ndarray,
    bundle: Bundle,
    backend: str,
    precision: str,
    when: str,
    source: str,
    implements: np.ndarray | None = None,
) -> EngineParity:
    """The verdict for actions ``got`` against the fp32 reference ``want`` and, for int8, against
    ``implements``, the Q/DQ graph's actions on the same states (None: the bundle has no Q/DQ graph)."""
    from sac_edge.calibration.gate import MAX_MEAN_ERROR_FRAC

    low, high = bundle.spec.action_low, bundle.spec.action_high
    for expected in (want, implements):
        if expected is not None and got.shape != expected.shape:
            raise SacEdgeError(
                f"parity gate: {backend}/{precision} gave actions of shape {got.shape}, expected {expected.shape}"
            )
    wide: np.ndarray = got.astype(np.float64)
    exact: np.ndarray = want.astype(np.float64)
    span = np.asarray(high, np.float64) - np.asarray(low, np.float64)
    err = np.abs(wide - exact)
    finite = bool(np.all(np.isfinite(err)))
    max_abs = float(err.max()) if finite else math.inf
    mean_abs = float(err.mean()) if finite else math.inf
    if precision == INT8 and implements is not None:
        qdq: np.ndarray = implements.astype(np.float64)
        value = _mean_frac(np.abs(wide - qdq), span)
        reference = _mean_frac(np.abs(qdq - exact), span)
        fp32_value, fp32_limit = _mean_frac(err, span), reference + INT8_KERNEL_FRAC
        passed = finite and value <= INT8_KERNEL_FRAC and fp32_value <= fp32_limit
        return EngineParity(
            backend, precision, when, len(got), source, max_abs, mean_abs,
            "mean action error / range against the Q/DQ graph", INT8_KERNEL_FRAC, value, passed,
            fp32_value, reference, fp32_limit,
        )  # fmt: skip
    if precision == INT8:
        value, rule, limit = _mean_frac(err, span), "mean action error / range", MAX_MEAN_ERROR_FRAC
    else:
        value, rule, limit = max_abs, "max abs action error", tolerance(precision, low, high)
    return EngineParity(
        backend, precision, when, len(got), source, max_abs, mean_abs, rule, limit, value, finite and value <= limit
    )


def verify(
    run_batch: Callable[[np.ndarray], np.ndarray],
    run_one: Callable[[np.ndarray], np.ndarray] | None,
    bundle: Bundle,
    backend: str,
    precision: str,
    when: str,
    weights: Mapping[str, np.ndarray] | None = None,
) -> EngineParity:
    """Run the held-out states through ``run_batch`` (and the first rows one at a time through ``run_one``,
    the serving path, when given) and judge them against the fp32 ONNX (and for int8 the Q/DQ graph) with
    ``weights`` (None: the bundle's own)."""
    states, source = gate_states(bundle)
    want = reference_actions(bundle, states, weights)
    implements = None
    if precision == INT8 and bundle.onnx(INT8) is not None:
        implements = reference_actions(bundle, states, weights, INT8)
    got = [np.asarray(run_batch(states), np.float32)]
    if run_one is not None:
        rows = min(ACT_ROWS, len(states))
        got.append(np.stack([np.array(run_one(states[i]), np.float32) for i in range(rows)]))
        want = np.concatenate([want, want[:rows]])
        implements = None if implements is None else np.concatenate([implements, implements[:rows]])
    return judge(np.concatenate(got), want, bundle, backend, precision, when, source, implements)


def require(parity: EngineParity, action: str) -> EngineParity:
    """``parity`` when it passed; otherwise a ``ParityError`` saying what was done about it (``action``)."""
    if not parity.passed:
        raise ParityError(parity, action)
    return parity


def check_backend(backend: Backend, bundle: Bundle, when: str) -> EngineParity:
    """``verify`` through a backend's own ``act_batch`` and ``act``, with the weights it serves."""
    return verify(backend.act_batch, backend.act, bundle, backend.name, backend.precision, when)


def gate_open(backend: Backend, bundle: Bundle) -> EngineParity:
    """The gate on a backend just opened, through its own ``act_batch`` and ``act``; the backend records the
    verdict (``Backend.parity_checked``) and a failure is a ParityError saying what was done."""
    parity = check_backend(backend, bundle, backend.opened_as)
    action = backend.parity_checked(parity.passed, parity.to_dict())
    backend.parity = require(parity, action).to_dict()
    return parity


class SwapGate:
    """The gate a gated backend's swaps pass (``Backend.gate_swaps``): the new generation's batch path
    against the fp32 reference with the same weights, before it is published."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle

    def __call__(self, backend: Backend, pending: PendingSwap) -> None:
        parity = verify(
            pending.run_batch, None, self.bundle, backend.name, backend.precision, pending.when, pending.weights
        )
        backend.parity = require(parity, "the swap was not applied").to_dict()
