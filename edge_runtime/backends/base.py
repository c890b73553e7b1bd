"""The one inference interface the control loop, bench and fine-tuner talk to (Polygraphy-style).

A backend loads one entry of a bundle (a precision of the policy) and runs it:

- ``act(obs)`` is the hot path, batch 1: the observation is copied into a preallocated input and the
  action comes back in a preallocated output. The returned array is the *same object* every call, so the
  loop must copy it (or finish with it) before the next call. ``act`` is for one control thread.
- ``act_batch(obs[n, d])`` is for bench and evaluation; it may allocate.
- ``swap_weights(weights)`` installs a new weight set atomically (the new runner is built, or a retired one
  no reader can still be using is refilled, aside by the backend's ``prepare_swap``, checked by the
  parity gate where the registry gated the backend, and published with one reference assignment), so a
  reader never sees half of one set and half of another, nor a set that failed its gate. Weights are keyed
  by the ``InferencePolicy`` state-dict names, which are also the initializer names of the bundle's fp32
  ONNX graph (``actor.trunk.0.weight``, ...). It may be called from any thread.
- ``describe()`` says what runs (backend, precision, file, provider/device, versions) for logs and JSON.

Heavy dependencies (torch, tensorrt, cuda-python/pycuda) are imported inside the backend that needs
them, so the onnxruntime path never imports torch; a missing one is a one-line ``SacEdgeError``.
"""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FP16, FP32, INT8
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.spec import PolicySpec

ACCEPTED = ("accepted", "accepted-mixed")


def gate_entry(bundle: Bundle, precision: str) -> dict[str, Any] | None:
    """The accuracy-gate record for ``precision``: sac-export writes the INT8 gate as ``manifest["gate"]``
    itself; a gate keyed by precision (``{"int8": {...}}``) is read too."""
    gate = bundle.manifest.get("gate")
    if not isinstance(gate, dict):
        return None
    if "verdict" in gate:
        return gate if precision == INT8 else None
    entry = gate.get(precision)
    return entry if isinstance(entry, dict) else None


def gate_refusal(bundle: Bundle, precision: str) -> str | None:
    """Why ``precision`` may not serve actions (None when it may).

    fp32 is the reference. int8 must have been accepted by the bundle's accuracy gate (an ungated int8
    graph is refused: nothing showed its actions are close to fp32's). fp16 is not gated by sac-export
    (TensorRT fp16 of an MLP stays within ~1e-3 of fp32), so it is refused only if a gate rejected it.
    """
    if precision == FP32:
        return None
    entry = gate_entry(bundle, precision)
    verdict = entry.get("verdict") if entry else None
    if verdict in ACCEPTED or (verdict is None and precision == FP16):
        return None
    if verdict is None:
        return f"{precision} has no accuracy-gate verdict in the bundle (re-export it with --int8)"
    assert entry is not None
    gate = ", ".join(
        f"{k}={v}" for k, v in sorted(entry.items()) if isinstance(v, (int, float, str)) and k != "verdict"
    )
    return f"{precision} was {verdict} by the bundle's accuracy gate" + (f" ({gate[:200]})" if gate else "")


class SwapReport(NamedTuple):
    """What a weight swap did: tensors installed, names the graph does not use, and the time taken."""

    applied: int
    ignored: tuple[str, ...]
    seconds: float


class SwapPath(enum.Enum):
    """A weight-swap strategy of onnxruntime's CPU provider (``backends/onnxrt/runner.py``; the values are
    what ``describe()["swap"]`` reports). The GPU providers always rebuild from the file, and the other
    backends have one way each (TensorRT refits or rebuilds, torch copies its module)."""

    AUTO = "auto"
    """In place for fp32 with ``refit``, else the pre-optimised rebuild with ``refit``, else from the file;
    each falls back to the next when its start-up check fails on this onnxruntime and graph."""
    IN_PLACE = "in place"
    """Two generations over numpy arrays the session reads where they are; a swap refills the retired one."""
    PRE_OPTIMISED = "rebuild (pre-optimised)"
    """A new session built from the graph onnxruntime optimised at start, optimisation off."""
    FROM_FILE = "rebuild"
    """A new session built from the graph file with the new initializers."""


@dataclass(frozen=True)
class BackendOptions:
    """Knobs shared by the backends."""

    threads: int = 1
    """Intra-op threads (onnxruntime, torch): 1 keeps latency steady on a shared edge CPU."""
    engine_dir: Path | None = None
    """Where TensorRT plans are cached (default: ``BUNDLE/engines``)."""
    refit: bool = False
    """Build for weight swaps (``--finetune``): TensorRT engines refittable (off otherwise, since REFIT can
    cost speed and, per the TensorRT 11.3 docs, drop a GEMM bias); onnxruntime's CPU fp32 session as two
    generations refilled in place (``backends/onnxrt/runner.py``)."""
    swap: SwapPath = SwapPath.AUTO
    """How onnxruntime's CPU provider installs new weights (``SwapPath``); the default picks the fastest this
    onnxruntime supports for the graph. Benchmarks select one explicitly to price it against the others."""


class PendingSwap(NamedTuple):
    """A weight set built aside by ``Backend.prepare_swap``, not serving yet: what the parity gate runs
    and what ``publish`` installs with one assignment."""

    run_batch: Callable[[np.ndarray], np.ndarray]
    """The new generation's batch path (for the gate; never the serving context)."""
    weights: Mapping[str, np.ndarray]
    """The weights the gate's fp32 reference is given: all those asked for, so that a generation which did
    not take one of them fails."""
    when: str
    """What the gate calls this check ("swap", "refit", "rebuild")."""
    applied: int
    ignored: tuple[str, ...]
    publish: Callable[[], None]


class SwapCheck(Protocol):
    """What the registry attaches to a gated backend: raises (and the swap is not published) unless
    ``pending`` passes (``parity_gate.SwapGate``)."""

    def __call__(self, backend: Backend, pending: PendingSwap) -> None: ...


class Backend(abc.ABC):
    """A loaded policy that maps raw observations to env-unit actions."""

    name: str
    precision: str
    opened_as = "session"
    """What the parity gate calls its check at open (TensorRT: "build" or "cached plan")."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self.swaps = 0
        self.parity: dict[str, Any] | None = None
        """The last engine parity gate's result (``parity_gate.EngineParity.to_dict``), for gated backends."""
        self._swap_check: SwapCheck | None = None

    @abc.abstractmethod
    def act(self, obs: np.ndarray) -> np.ndarray:
        """Action ``[act_dim]`` for one observation ``[obs_dim]``; the returned buffer is reused."""

    @abc.abstractmethod
    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        """Actions ``[n, act_dim]`` for observations ``[n, obs_dim]`` (a new array)."""

    @abc.abstractmethod
    def prepare_swap(self, weights: Mapping[str, np.ndarray]) -> PendingSwap:
        """Build ``weights`` aside (the serving generation untouched) and say how to publish them."""

    def swap_weights(self, weights: Mapping[str, np.ndarray]) -> SwapReport:
        """Install ``weights`` atomically (see the module docstring): prepared aside, through the gate the
        registry attached (a failure raises and nothing changes), then published."""
        start = time.perf_counter()
        pending = self.prepare_swap(weights)
        if self._swap_check is not None:
            self._swap_check(self, pending)
        pending.publish()
        self.swaps += 1
        return SwapReport(pending.applied, pending.ignored, time.perf_counter() - start)

    def gate_swaps(self, check: SwapCheck) -> None:
        """Make every later swap pass ``check`` before it is published (the registry, once, at open)."""
        if self._swap_check is not None:
            raise InternalError(f"backend {self.name!r}: its swaps are gated already")
        self._swap_check = check

    def parity_checked(self, passed: bool, result: Mapping[str, Any]) -> str:
        """The gate's verdict at open, for a backend that records it (TensorRT's plan sidecar); returns what
        a failure does, for the error line."""
        return "not served"

    def bare_call(self) -> Callable[[], object]:
        """The library call ``act`` makes, on the backend's own input and output buffers, without the
        wrapper's copies and bookkeeping: what benchmarks price ``act`` against."""
        raise NotImplementedError(f"backend {self.name!r} has no bare call")

    def describe(self) -> dict[str, Any]:
        """Backend, precision and whatever identifies the runtime (extended by each backend)."""
        out = {"backend": self.name, "precision": self.precision, "swaps": self.swaps}
        return {**out, "parity": self.parity} if self.parity is not None else out

    def close(self) -> None:  # noqa: B027 - optional hook, most backends free with the GC
        """Release device resources early (optional)."""


def check_weights(
    weights: Mapping[str, np.ndarray],
    known: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Split ``weights`` into arrays the runner uses (float32, or the ``dtypes`` entry for a name: int8
    weights and int32 biases of an integer graph) and the names it does not have.

    A known name with the wrong shape is an error (it would be a different network), so a swap never
    installs a partial set.
    """
    use: dict[str, np.ndarray] = {}
    ignored = []
    for name, value in weights.items():
        if name not in known:
            ignored.append(name)
            continue
        dtype = (dtypes or {}).get(name, np.float32)
        arr = np.asarray(value, dtype=dtype, order="C")  # ascontiguousarray would make a 0-d array 1-d
        if tuple(arr.shape) != tuple(known[name]):
            raise SacEdgeError(f"swap_weights: {name} has shape {tuple(arr.shape)}, the policy has {known[name]}")
        use[name] = arr
    return use, tuple(sorted(ignored))


def missing_package(backend: str, package: str, hint: str) -> SacEdgeError:
    """The one-line error for a backend whose optional dependency is not installed."""
    return SacEdgeError(f"backend {backend!r} needs the Python package {package!r}, which is not installed ({hint})")


class BackendKind(NamedTuple):
    """A backend as the registry sees it: why it cannot run here, what it can run, how to load it, and which
    of its precisions the engine parity gate must pass (``registry.open_backend``, the one way a backend
    is opened, enforces it at open and on every swap)."""

    name: str
    unavailable: Callable[[], str | None]
    """None when usable here, else a one-line reason (missing package, no device)."""
    precisions: Callable[[Bundle], tuple[str, ...]]
    """Precisions this backend can run from this bundle (before the accuracy gate)."""
    load: Callable[[Bundle, str, BackendOptions], Backend]
    """Build the backend (not gated yet: only the registry calls it)."""
    gated: tuple[str, ...] = ()
    """Precisions that serve only after the engine parity gate passed, at open and on every swap: a
    device's engines and sessions (empty for the CPU reference paths the gate compares against)."""
