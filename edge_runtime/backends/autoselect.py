"""``--backend auto``: time every backend x precision that may run and keep the lowest p99 latency.

On a Jetson a tiny MLP can be faster on the CPU than through a GPU launch, so nothing is assumed: each
candidate that passed the bundle's accuracy gate (int8 only when the gate accepted it) is opened, warmed
up and timed for a moment, and the timings are logged with the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.latency import latency_us, time_calls

from .base import Backend, BackendOptions
from .registry import KINDS, candidates, open_backend


class Measurement(NamedTuple):
    """One candidate's start-up timing (or why it was not timed)."""

    backend: str
    precision: str
    p50_us: float | None
    p99_us: float | None
    max_us: float | None
    refusal: str | None

    def line(self) -> str:
        if self.refusal is not None:
            return f"{self.backend}/{self.precision}: skipped ({self.refusal})"
        return f"{self.backend}/{self.precision}: p50 {self.p50_us:.1f} us, p99 {self.p99_us:.1f} us"


def is_absent(refusal: str) -> bool:
    """A candidate that does not exist here (a backend not installed, a precision not in the bundle)."""
    return "unavailable" in refusal or "not in the bundle" in refusal


def chosen_line(chosen: Backend, measurements: Sequence[Measurement]) -> str:
    """The choice in one line: the winner's timing, the others timed, and what does not exist here (named once
    per backend; ``sac-edge doctor`` says why). Every start prints it: one line, not one per candidate."""
    timed = [m for m in measurements if m.refusal is None]
    won = next(m for m in timed if (m.backend, m.precision) == (chosen.name, chosen.precision))
    said = f"auto: chose {chosen.name}/{chosen.precision} (p99 {won.p99_us:.1f} us, the lowest of {len(timed)} timed"
    others = [f"{m.backend}/{m.precision} {m.p99_us:.1f}" for m in timed if m is not won]
    said += (": " + ", ".join(others) + " us)") if others else ")"
    absent = list(dict.fromkeys(m.backend if "unavailable" in (m.refusal or "") else f"{m.backend}/{m.precision}"
                                for m in measurements if m.refusal is not None and is_absent(m.refusal)))  # fmt: skip
    return said + (f"; not here: {', '.join(absent)} (sac-edge doctor says why)" if absent else "")


def probe_observations(obs_dim: int, count: int = 64, seed: int = 0) -> np.ndarray:
    """Fixed pseudo-random observations to time on (timing does not depend on their values)."""
    return np.random.default_rng(seed).standard_normal((count, obs_dim)).astype(np.float32)


def time_backend(backend: Backend, calls: int = 200, warmup: int = 50) -> np.ndarray:
    """Per-call ``act`` latency (ns) on the probe observations."""
    probes = probe_observations(backend.spec.obs_dim)
    return time_calls(lambda i: backend.act(probes[i % len(probes)]), calls, warmup)


def autoselect(
    bundle: Bundle,
    options: BackendOptions,
    precisions: Sequence[str] | None = None,
    backends: Sequence[str] | None = None,
    calls: int = 200,
    warmup: int = 50,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[Backend, list[Measurement]]:
    """Open, time and compare every usable candidate; return the winner (kept open) and every measurement.

    ``backends`` defaults to all but the torch reference: it is never faster than onnxruntime on a small
    MLP and importing it would cost the inference-only path ~300 MB.
    """
    backends = backends or [name for name in KINDS if name != "torch"]
    best: tuple[float, Backend] | None = None
    measurements = []
    for cand in candidates(bundle, backends, precisions):
        if cand.refusal is not None:
            measurements.append(Measurement(cand.backend, cand.precision, None, None, None, cand.refusal))
            continue
        try:
            backend = open_backend(bundle, cand.backend, cand.precision, options)
        except SacEdgeError as err:  # a provider that falls back at session creation, a failed parity gate
            measurements.append(Measurement(cand.backend, cand.precision, None, None, None, str(err)))
            continue
        lat = latency_us(time_backend(backend, calls, warmup))
        measurements.append(Measurement(cand.backend, cand.precision, lat["p50"], lat["p99"], lat["max"], None))
        if best is None or lat["p99"] < best[0]:
            if best is not None:
                best[1].close()
            best = (lat["p99"], backend)
        else:
            backend.close()
    if best is None:
        raise SacEdgeError(
            "--backend auto: no backend can run this bundle here (" + "; ".join(m.line() for m in measurements) + ")"
        )
    chosen = best[1]
    for m in measurements:
        if m.refusal is not None and not is_absent(m.refusal):
            log("auto: " + m.line())  # a finding (a failed gate, a rejected precision): a line of its own
    log(chosen_line(chosen, measurements))
    return chosen, measurements
