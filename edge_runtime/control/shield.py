"""The safety shield: the policy's actions shaped and, off familiar ground, replaced by a fallback.

It sits after the observation and action guards (``safety.py``), which keep every action finite and inside
the bounds; the shield decides whether the policy's action is the one to send. Per step, on the raw
observation and the guarded action:

- **Envelope**: the observation must lie inside the bundle's envelope (``envelope.json``,
  ``common/envelope.py``): per-dimension bounds from the training states and a Mahalanobis distance under
  a threshold calibrated on held-out training states. A non-finite or malformed observation is outside.
- **Stuck sensor**: ``stuck_steps`` observations in a row that are identical bit for bit.
- **Fallback**: after ``window`` consecutive steps outside the envelope, on a stuck sensor, or when the
  step's action was not inferred (an overrun, a backend error, an observation the guard held), the shield
  switches to the fallback action (``hold``: the action it sent at the last step that was inside and clear;
  ``fixed``: the safe action, from
  ``--safe-action`` or the envelope) on that same step. It returns once ``window`` consecutive steps are
  clear again, through the ramp.
- **Ramp**: over ``ramp_steps`` steps the sent action blends from where it was (the safe action at the start
  of an episode) to the policy's, linearly: at the start, when a fallback ends and after a weight swap.
- **Slew limit**: no action dimension changes by more than ``slew`` between consecutive steps (default
  from the envelope: the exported policy's own largest step-to-step change, widened; none when the bundle
  has none), fallback switches included.

Every switch is a telemetry event (``{"type": "shield", "event": "fallback" | "resume" | "swap_ramp", ...}``)
and is counted in the summary (``ShieldSummary``). The work is a few numpy calls for the envelope and a
loop over Python floats for the action (a handful of dimensions: cheaper than numpy's per-call cost;
``bench/shield.py`` times it against the loop without the shield).
"""

from __future__ import annotations

import copy
import math
import struct
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sac_edge.common.envelope import Envelope

from .safety import PYTHON_CHECK_MAX

_dist = math.dist

SHIELD_MODES = ("on", "guards")
"""``guards``: the observation and action guards alone (the runtime's behaviour without a shield)."""
FALLBACKS = ("hold", "fixed")
CAUSES = ("envelope", "stuck", "not_inferred")


@dataclass(frozen=True)
class ShieldSettings:
    """The shield's knobs (the ``--shield*`` flags; ``RunConfig`` holds the same names)."""

    mode: str = "on"
    window: int = 3
    """M: consecutive steps outside the envelope before the fallback (0: the envelope is not checked)."""
    stuck_steps: int = 5
    """K: bit-identical observations in a row that flag a stuck sensor (0: off)."""
    ramp_steps: int = 5
    """N: steps of the blend-in ramp (0: no ramp)."""
    fallback: str = "hold"
    safe_action: tuple[float, ...] = ()
    """The fixed fallback and the ramp's start; empty: the envelope's (0 clipped to the bounds without one)."""
    slew: tuple[float, ...] = ()
    """Largest change per step, one value for every dimension or one per dimension; empty: the envelope's
    default; 0: no limit."""

    def problem(self, act_dim: int | None = None) -> str | None:
        """What is wrong with the settings (a line naming the flag), or None."""
        if self.mode not in SHIELD_MODES:
            return f"--shield must be one of {', '.join(SHIELD_MODES)}, got {self.mode!r}"
        if self.fallback not in FALLBACKS:
            return f"--fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}"
        for flag, value in (("--shield-window", self.window), ("--stuck-steps", self.stuck_steps)):
            if not 0 <= value <= 1_000_000:
                return f"{flag} must be from 0 (off) to 1000000 steps, got {value}"
        if self.stuck_steps == 1:
            return "--stuck-steps must be at least 2 (one observation cannot repeat) or 0 (off)"
        if not 0 <= self.ramp_steps <= 1_000_000:
            return f"--ramp-steps must be from 0 (no ramp) to 1000000 steps, got {self.ramp_steps}"
        if not all(math.isfinite(v) and v >= 0 for v in self.slew):
            return "--slew takes finite non-negative changes per step (0: no limit)"
        if not all(math.isfinite(v) for v in self.safe_action):
            return "--safe-action takes finite numbers"
        if act_dim is not None:
            if len(self.slew) not in (0, 1, act_dim):
                return f"--slew takes one value or {act_dim} (the bundle's act_dim), got {len(self.slew)}"
            if self.safe_action and len(self.safe_action) != act_dim:
                return f"--safe-action takes {act_dim} numbers (the bundle's act_dim), got {len(self.safe_action)}"
        return None


ShieldSummary = typing.Dict[str, Any]
"""The shield's settings and counts, JSON-ready (keys in docs/CONTRACTS.md under ``shield``)."""


def _ignore(_: dict[str, Any]) -> None:
    pass


@dataclass
class _Counts:
    out_of_envelope: int = 0
    stuck: int = 0
    fallbacks: int = 0
    fallback_steps: int = 0
    causes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    ramps: int = 0
    swap_ramps: int = 0
    slew_limited: int = 0
    first_fallback_step: int | None = None


class Shield:
    """Shapes each guarded action (module docstring). ``step`` and ``restart`` come from the control
    thread; ``weights_swapped`` from any (it only raises a counter the control thread reads)."""

    def __init__(
        self,
        settings: ShieldSettings,
        action_low: Sequence[float],
        action_high: Sequence[float],
        envelope: Envelope | None,
        emit: Callable[[dict[str, Any]], None] = lambda _: None,
    ) -> None:
        self.settings = settings
        self.envelope = envelope
        self.emit = emit
        low = [float(v) for v in action_low]
        high = [float(v) for v in action_high]
        self._bounds = list(zip(low, high))
        dim = len(low)
        self._dims = range(dim)
        if settings.safe_action:
            safe = list(settings.safe_action)
        elif envelope is not None:
            safe = envelope.safe_action.tolist()
        else:
            safe = [0.0] * dim
        self.safe_action = [min(max(v, lo), hi) for v, (lo, hi) in zip(safe, self._bounds)]
        if settings.slew:
            slew = list(settings.slew) * (dim if len(settings.slew) == 1 else 1)
        elif envelope is not None and envelope.slew is not None:
            slew = envelope.slew.tolist()
        else:
            slew = [0.0] * dim
        self.slew = [v if v > 0 else math.inf for v in slew]
        self._limit = any(math.isfinite(v) for v in self.slew)
        self._check = envelope is not None and settings.window > 0
        if envelope is not None:  # score = |A obs - A mean|^2 with A = W diag(1/scale)
            self._a = np.ascontiguousarray(envelope.whiten / envelope.scale[None, :])
            self._center = (self._a @ envelope.mean).tolist()
            self._radius = math.sqrt(envelope.threshold)
            self._low, self._high = envelope.low, envelope.high
            self._obs_bounds = list(zip(envelope.low.tolist(), envelope.high.tolist()))
            self._python = envelope.obs_dim <= PYTHON_CHECK_MAX
            self._shape = (envelope.obs_dim,)
            self._w = np.empty(envelope.obs_dim)
        self._out = np.array(self.safe_action, dtype=np.float32)
        self._pack = struct.Struct(f"{dim}f").pack_into
        self._twin: Shield | None = None
        # what the rehearsal's stand-in keeps its own (``rehearse``)
        self._twin_own = {"_out": self._out.copy(), "counts": _Counts(), "emit": _ignore, "_twin": None}
        self._swaps = 0
        self._seen_swaps = 0
        self.counts = _Counts()
        self.steps = 0
        # the state ``restart`` resets: the action last sent, the ramp, the fallback, the windows
        self._sent: list[float] = []
        self._held: list[float] = []
        """The action sent at the last step whose observation was inside and clear: what ``hold`` holds."""
        self._ramp_from: list[float] = []
        self._fallback: list[float] = []
        self._previous: bytes | None = None
        self._ramp_left = self._ramp_total = self._outside = self._repeats = self._clear = 0
        self._window = self._stuck_after = 1
        self._falling_back = False
        self.restart()

    # -- per step ------------------------------------------------------------------------------------
    @property
    def obs_bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The envelope's per-dimension bounds the shield checks (None when it checks none): the
        observation guard tests them in its own pass (``ObservationGuard(inner=...)``)."""
        return (self._low, self._high) if self._check else None

    def inside(self, obs: object) -> bool:
        """Whether ``obs`` is inside the envelope (no side effects; True without an envelope)."""
        if not self._check:
            return True
        if not isinstance(obs, np.ndarray) or obs.shape != self._shape or obs.dtype.kind not in "fiu":
            return False
        # The bounds first (over Python floats up to PYTHON_CHECK_MAX dimensions, as the guard does): a
        # non-finite value fails here (NaN compares false), so the product below only sees finite values.
        if self._python:
            for v, (lo, hi) in zip(obs.tolist(), self._obs_bounds):
                if not lo <= v <= hi:
                    return False
        elif not bool(((obs >= self._low) & (obs <= self._high)).all()):
            return False
        w = self._w
        self._a.dot(obs, out=w)  # the method with ``out``: no temporary, and less than np.dot's dispatch
        # |A obs - A mean| by math.dist over the product's floats: less than a numpy subtract and dot
        return _dist(w.tolist(), self._center) <= self._radius

    def step(self, obs: object, action: np.ndarray, inferred: bool) -> np.ndarray:
        """The action to send for this step (a buffer reused by the next call): ``action`` (the guarded
        one) shaped, or the fallback; ``inferred`` is whether ``action`` was inferred for ``obs`` now."""
        values = action.tolist() if action.ndim == 1 else action.reshape(-1).tolist()
        # clipped here, as the runtime's action guard does on its path: ``shape`` keeps what lies in bounds
        clipped = [hi if v > hi else lo if v < lo else v for v, (lo, hi) in zip(values, self._bounds)]
        return self.shape(obs, None, clipped, inferred)

    def shape(self, obs: object, values: list[float] | None, action: list[float], inferred: bool) -> np.ndarray:
        """``step`` on what a caller that ran the guards has already: ``values``, ``obs``'s own values as
        Python floats found inside ``obs_bounds`` (``inside``; None: the shield checks ``obs`` itself), and
        ``action``, the guarded action as Python floats, inside the bounds. The runtime calls this: no
        conversion or bounds test is made twice."""
        self.steps += 1
        if not self._check:
            inside = True
        elif values is None:
            inside = self.inside(obs)
        else:  # ``inside``'s last three lines, inlined: the guard found ``obs`` well formed and in the bounds
            w = self._w
            self._a.dot(obs, out=w)
            inside = _dist(w.tolist(), self._center) <= self._radius
        if inside:
            self._outside = 0
        else:
            self._outside += 1
            self.counts.out_of_envelope += 1
        cause = None
        if self._stuck_after:
            data = obs.tobytes() if isinstance(obs, np.ndarray) else None
            if data is not None and data == self._previous:
                self._repeats += 1
                if self._repeats >= self._stuck_after:
                    self.counts.stuck += 1
                    cause = "stuck"
            else:
                self._repeats = 1
                self._previous = data
        if not inferred:
            cause = "not_inferred"
        elif cause is None and self._outside >= self._window:
            cause = "envelope"
        if cause is not None:
            self._clear = 0
            if not self._falling_back:
                self._enter(cause)
        elif self._falling_back:
            self._clear += 1
            if self._clear >= self._window:
                self._leave()
        if self._swaps != self._seen_swaps:
            self._swapped()
        if self._falling_back:
            self.counts.fallback_steps += 1
            action = self._fallback
        elif self._ramp_left:
            alpha = (self._ramp_total - self._ramp_left + 1) / self._ramp_total
            self._ramp_left -= 1
            action = self._blend(action, alpha)
        # The slew limit against the action last sent, inlined (a call costs as much as the loop's work),
        # by index (cheaper than a zip of three), copying ``action`` only when a value is limited. Both lie
        # inside the bounds (the guarded action, the fallback, a clipped blend), so a limited value does too.
        sent, last_sent, slew = action, self._sent, self.slew
        for i in self._dims:
            v, last, most = action[i], last_sent[i], slew[i]
            if v > last + most:
                v = last + most
            elif v < last - most:
                v = last - most
            else:
                continue
            if sent is action:
                sent = list(action)
            sent[i] = v
        if sent is not action:
            self.counts.slew_limited += 1
        self._sent = sent
        if inside and cause is None:
            self._held = sent
        out = self._out
        self._pack(out, 0, *sent)  # struct's pack_into: cheaper than numpy's item assignment from a list
        return out

    def _blend(self, action: list[float], alpha: float) -> list[float]:
        """The ramp's action: ``alpha`` of the way from where it started to ``action``, clipped to the
        bounds against rounding (no side effects)."""
        blend = [a + alpha * (b - a) for a, b in zip(self._ramp_from, action)]
        return [hi if v > hi else lo if v < lo else v for v, (lo, hi) in zip(blend, self._bounds)]

    def rehearse(self, obs: object, values: list[float] | None, action: list[float]) -> None:
        """``shape`` without its effects, for the loop's rehearsal before the slot: run on a stand-in that
        takes this shield's state each time but keeps its own counts, output buffer and (silent) events,
        so that the step's own code, and the data it reads, are in the caches when the slot comes."""
        twin = self._twin
        if twin is None:
            twin = self._twin = copy.copy(self)
        state = twin.__dict__
        state.update(self.__dict__)
        state.update(self._twin_own)
        twin.shape(obs, values, action, True)

    def _swapped(self) -> None:
        """The first step after a weight swap: the ramp from the action last sent (not while falling back)."""
        self._seen_swaps = self._swaps
        if not self._falling_back and self._ramp_total:
            self.counts.swap_ramps += 1
            self._ramp_from, self._ramp_left = list(self._sent), self._ramp_total
            self.emit({"type": "shield", "event": "swap_ramp", "step": self.steps})

    def _enter(self, cause: str) -> None:
        counts = self.counts
        self._falling_back = True
        counts.fallbacks += 1
        counts.causes[cause] += 1
        if counts.first_fallback_step is None:
            counts.first_fallback_step = self.steps
        self._fallback = list(self._held) if self.settings.fallback == "hold" else list(self.safe_action)
        self._ramp_left = 0
        self.emit({"type": "shield", "event": "fallback", "cause": cause, "step": self.steps})

    def _leave(self) -> None:
        self._falling_back = False
        if self._ramp_total:
            self.counts.ramps += 1
            self._ramp_from, self._ramp_left = list(self._sent), self._ramp_total
        self.emit({"type": "shield", "event": "resume", "step": self.steps})

    # -- events from outside the step ----------------------------------------------------------------
    def restart(self) -> None:
        """A new start (the first step, a new episode): the ramp from the safe action, no history."""
        s = self.settings
        self._window = max(s.window, 1)
        self._stuck_after = s.stuck_steps
        self._ramp_total = s.ramp_steps
        self._sent = self._held = list(self.safe_action)
        self._ramp_from, self._ramp_left = list(self.safe_action), s.ramp_steps
        self._outside = self._repeats = self._clear = 0
        self._previous = None
        self._falling_back = False
        self._fallback = list(self.safe_action)

    def weights_swapped(self) -> None:
        """The policy's weights changed (any thread): the next step starts the ramp from the action sent."""
        self._swaps += 1

    @property
    def falling_back(self) -> bool:
        return self._falling_back

    def summary(self) -> ShieldSummary:
        c, s = self.counts, self.settings
        return dict(
            mode=s.mode,
            envelope=self._check,
            window=s.window,
            stuck_steps=s.stuck_steps,
            ramp_steps=s.ramp_steps,
            fallback=s.fallback,
            slew_limit=self._limit,
            out_of_envelope=c.out_of_envelope,
            stuck=c.stuck,
            fallbacks=c.fallbacks,
            fallback_causes=dict(c.causes),
            fallback_steps=c.fallback_steps,
            first_fallback_step=c.first_fallback_step,
            ramps=c.ramps,
            swap_ramps=c.swap_ramps,
            slew_limited=c.slew_limited,
        )


def guards_summary() -> ShieldSummary:
    """The summary's ``shield`` entry in ``guards`` mode (no shield ran)."""
    return {"mode": "guards"}
