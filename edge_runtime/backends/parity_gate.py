"""The engine parity gate: no engine or execution-provider session serves an action it has not proven.

After every TensorRT engine build, every plan loaded from a cache, every refit or rebuild for new weights
and every onnxruntime TensorRT/CUDA session, the bundle's held-out states (``parity_states.npy``, written
by ``sac-export`` from the parity check's held-out set) go through the backend under test, both through
``act_batch`` (its own context and profile) and through ``act`` on the first rows (the serving context),
and are compared with the fp32 ONNX reference through onnxruntime's CPU provider with the same weights:

- fp32 and fp16: max abs action error <= ``common.tolerance.tolerance`` (a fraction of the action range);
- int8: the accuracy gate's rule, mean abs action error <= ``MAX_MEAN_ERROR_FRAC`` of the range (and
  every action finite).

Which backends and precisions are gated is declared once per backend kind (``BackendKind.gated``) and
enforced by the registry, the one way a backend is opened: ``gate_open`` before it serves, and a
``SwapGate`` it attaches that every ``swap_weights`` passes before it publishes. A backend never runs the
gate itself, so a new kind cannot forget it.

A failure is a ``ParityError`` (a ``SacEdgeError``) whose one line names the figures; the caller does not
serve that backend (``--backend auto`` goes on to the next candidate, a cached plan is deleted) and the
figures go into the plan's sidecar, the telemetry and ``sac-edge doctor`` (``EngineParity.to_dict``).
This is the check that catches uninitialised batch outputs, stale engine caches, dropped biases and stale
INT8 scales on a real device, where the code paths cannot be run here.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.tolerance import tolerance

from .base import Backend, Bundle, PendingSwap

STATES_KIND = "parity-states"  # export/bundle.py FILE_KINDS
ACT_ROWS = 32  # rows also sent one at a time through act (the serving context)


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

    def line(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"parity gate {verdict} for {self.backend}/{self.precision} ({self.when}): {self.rule} "
            f"{self.value:.3g} vs limit {self.limit:.3g} on {self.states} held-out states "
            f"(max abs {self.max_abs:.3g}, mean abs {self.mean_abs:.3g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()


class ParityError(InternalError):
    """An engine or session that disagrees with the fp32 ONNX (exit 1); ``parity`` holds the figures."""

    def __init__(self, parity: EngineParity, action: str) -> None:
        super().__init__(f"{parity.line()}; {action}")
        self.parity = parity


def gate_states(bundle: Bundle) -> tuple[np.ndarray, str]:
    """The bundle's held-out states, or (a bundle exported before they were kept) seeded standard-normal
    observations, labelled as such."""
    names = bundle.files(STATES_KIND)
    if names:
        states = np.load(io.BytesIO(bundle.read(bundle.path / names[0])), allow_pickle=False)
        if states.ndim == 2 and states.shape[1] == bundle.spec.obs_dim and len(states):
            return np.ascontiguousarray(states, np.float32), names[0]
        raise SacEdgeError(f"{bundle.path / names[0]}: held-out states have shape {states.shape}; re-export the bundle")
    states = np.random.default_rng(0).standard_normal((256, bundle.spec.obs_dim)).astype(np.float32)
    return states, "seeded normal observations (the bundle has no parity_states.npy)"


def reference_actions(
    bundle: Bundle, states: np.ndarray, weights: Mapping[str, np.ndarray] | None = None
) -> np.ndarray:
    """The fp32 ONNX's actions on ``states`` through onnxruntime's CPU provider, with the initializers of
    ``weights`` that the fp32 graph has (the weights a swap installed) in place of the bundle's."""
    import onnxruntime as ort

    model = bundle.onnx("fp32")
    if model is None:
        raise SacEdgeError(f"{bundle.path}: policy.onnx (the parity gate's reference) is missing; re-export")
    options = ort.SessionOptions()
    values = []
    if weights:
        import onnx

        graph = onnx.load_from_string(bundle.read(model)).graph
        names = {init.name for init in graph.initializer if init.data_type == onnx.TensorProto.FLOAT}
        for name in sorted(names & set(weights)):
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(weights[name], np.float32))
            options.add_initializer(name, value)
            values.append(value)
    session = ort.InferenceSession(bundle.read(model), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: states})[0], np.float32)


def judge(
    got: np.ndarray, want: np.ndarray, bundle: Bundle, backend: str, precision: str, when: str, source: str
) -> EngineParity:
    """The verdict for actions ``got`` against the reference ``want``."""
    from sac_edge.calibration.gate import MAX_MEAN_ERROR_FRAC

    low, high = bundle.spec.action_low, bundle.spec.action_high
    if got.shape != want.shape:
        raise SacEdgeError(
            f"parity gate: {backend}/{precision} gave actions of shape {got.shape}, expected {want.shape}"
        )
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    finite = bool(np.all(np.isfinite(err)))
    max_abs = float(err.max()) if finite else math.inf
    mean_abs = float(err.mean()) if finite else math.inf
    if precision == "int8":
        span = np.asarray(high, np.float64) - np.asarray(low, np.float64)
        value = float((err / span).mean()) if finite else math.inf
        rule, limit = "mean action error / range", MAX_MEAN_ERROR_FRAC
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
    the serving path, when given) and judge them against the fp32 ONNX with ``weights`` (None: the
    bundle's own)."""
    states, source = gate_states(bundle)
    want = reference_actions(bundle, states, weights)
    got = [np.asarray(run_batch(states), np.float32)]
    if run_one is not None:
        rows = min(ACT_ROWS, len(states))
        got.append(np.stack([np.array(run_one(states[i]), np.float32) for i in range(rows)]))
        want = np.concatenate([want, want[:rows]])
    return judge(np.concatenate(got), want, bundle, backend, precision, when, source)


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
