"""The safety shield: the policy's actions shaped and, off familiar ground, replaced by a fallback.

It sits after the observation and action guards (``safety.py``), which keep every action finite and inside
the bounds; the shield decides whether the policy's action is the one to send. Per step, on the raw
observation and the guarded action:

- **Envelope**: the observation must lie inside the bundle's envelope (``envelope.json``,
  ``common/envelope.py``): per-dimension bounds from the training states and a Mahalanobis distance under
  a threshold calibrated on held-out training states. A non-finite or malformed observation is outside.
- **Stuck sensor**: ``stuck_steps`` observations in a row that are identical bit for bit.
- **Fallback**: after ``shield_window`` consecutive steps outside the envelope, on a stuck sensor, or when the
  step's action was not inferred (an overrun, a backend error, an observation the guard held), the shield
  switches to the fallback action (``hold``: the action it sent at the last step that was inside and clear;
  ``fixed``: the safe action, from
  ``--safe-action`` or the envelope) on that same step. It returns once ``shield_window`` consecutive steps are
  clear again, through the ramp.
- **Ramp**: over ``ramp_steps`` steps the sent action blends from where it was (the safe action at the start
  of an episode) to the policy's, linearly: at the start, when a fallback ends and after a weight swap.
- **Slew limit**: no action dimension changes by more than ``slew`` between consecutive steps (default
  from the envelope: the exported policy's own largest step-to-step change, widened; none when the bundle
  has none), fallback switches included.

Every switch is a telemetry event (``{"type": "shield", "event": "fallback" | "resume" | "swap_ramp", ...}``)
and is counted in the summary (``ShieldSummary``). The work is one numpy product for the envelope and
loops over Python floats for the action, the cheaper form at a handful of dimensions (``bench/shield.py``
times it against the loop without the shield: BENCHMARKS.md "Edge: the safety shield" and "Edge: the step
as stages").
"""

from __future__ import annotations

import math
import struct
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sac_edge.common.config import check_fields
from sac_edge.common.envelope import Envelope
from sac_edge.common.errors import SacEdgeError

from .safety import PYTHON_CHECK_MAX

_dist = math.dist
_FLOAT32 = np.dtype(np.float32)

SHIELD_MODES = ("on", "guards")
"""``--shield``: ``on`` runs a ``Shield``; ``guards``: the observation and action guards alone."""
FALLBACKS = ("hold", "fixed")
CAUSES = ("envelope", "stuck", "not_inferred")


@dataclass(frozen=True)
class ShieldOptions:
    """The safety shield after the guards (envelope, stuck sensors, fallback, ramp, slew limit).

    The one type of the shield's options: ``Shield`` takes it, ``RuntimeOptions.shield`` holds it (None: no
    shield), ``sac-edge drill`` has its fields as flags, and ``sac-edge run``'s shield section
    (``config.ShieldSection``) holds it beside the ``--shield`` switch. Each field's ``help`` is its flag's
    ``--help`` line."""

    shield_window: int = field(
        default=3,
        metadata={"help": "consecutive steps outside the envelope that switch to the fallback (0: no envelope check)"},
    )
    """M: consecutive steps outside the envelope before the fallback, and clear steps before it ends (0: the
    envelope is not checked)."""
    stuck_steps: int = field(
        default=5, metadata={"help": "bit-identical observations in a row that flag a stuck sensor (0: off)"}
    )
    """K: bit-identical observations in a row that flag a stuck sensor (0: off)."""
    ramp_steps: int = field(
        default=5,
        metadata={"help": "steps of the blend-in ramp at start, after a fallback and after a weight swap (0: none)"},
    )
    """N: steps of the blend-in ramp (0: no ramp)."""
    fallback: str = field(
        default="hold",
        metadata={
            "help": "fallback action: hold (the last action sent on familiar ground) or fixed (--safe-action, "
            "else the bundle's)",
            "choices": list(FALLBACKS),
        },
    )
    safe_action: tuple[float, ...] = field(
        default=(), metadata={"help": "the fixed fallback action and the ramp's start, one number per action dim"}
    )
    """The fixed fallback and the ramp's start; empty: the envelope's (0 clipped to the bounds without one)."""
    slew: tuple[float, ...] = field(
        default=(),
        metadata={
            "help": "largest action change per step, one value or one per dim (default: the bundle's, from "
            "the policy's rollouts at export; 0: no limit)"
        },
    )
    """Largest change per step, one value for every dimension or one per dimension; empty: the envelope's
    default; 0: no limit."""

    def check(self, act_dim: int | None = None) -> None:
        """Every field, one line naming its flag; with ``act_dim`` (the bundle's, known at open) the sizes too."""
        check_fields(self)
        problem = self.problem(act_dim)
        if problem is not None:
            raise SacEdgeError(problem)

    def problem(self, act_dim: int | None = None) -> str | None:
        """What is wrong with the values (a line naming the flag), or None."""
        if self.fallback not in FALLBACKS:
            return f"--fallback must be one of {', '.join(FALLBACKS)}, got {self.fallback!r}"
        for flag, value in (("--shield-window", self.shield_window), ("--stuck-steps", self.stuck_steps)):
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


class StuckSensorDetector:
    """Flags a sensor that repeats itself: ``steps`` observations in a row identical bit for bit."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self._previous: bytes | None = None
        self._repeats = 0

    def update(self, observed: np.ndarray | None) -> bool:
        """Whether ``observed`` (None: malformed, which repeats nothing) completes such a run."""
        data = observed.tobytes() if observed is not None else None
        if data is not None and data == self._previous:
            self._repeats += 1
            return self._repeats >= self.steps
        self._repeats = 1
        self._previous = data
        return False

    def reset(self) -> None:
        self._previous, self._repeats = None, 0


class BlendRamp:
    """Blends the action sent from where it was to the policy's, linearly over ``steps`` steps."""

    def __init__(self, steps: int, bounds: list[tuple[float, float]]) -> None:
        self.steps = steps
        self.left = 0
        """Steps of the ramp still to come (0: not ramping)."""
        self._bounds = bounds
        self._origin: list[float] = []

    def start(self, origin: list[float]) -> bool:
        """Ramp from ``origin``; False (and nothing starts) with ``steps`` 0."""
        if not self.steps:
            return False
        self._origin, self.left = list(origin), self.steps
        return True

    def stop(self) -> None:
        self.left = 0

    def apply(self, action: list[float]) -> list[float]:
        """The next step's action: its share of the way from the origin to ``action``, clipped to the bounds
        against rounding."""
        alpha = (self.steps - self.left + 1) / self.steps
        self.left -= 1
        blend = [a + alpha * (b - a) for a, b in zip(self._origin, action)]
        return [hi if v > hi else lo if v < lo else v for v, (lo, hi) in zip(blend, self._bounds)]


class SlewLimiter:
    """Limits each dimension's change between consecutive actions (``slew``: per dimension, 0: no limit)."""

    def __init__(self, slew: list[float]) -> None:
        self.slew = [v if v > 0 else math.inf for v in slew]
        self.active = any(math.isfinite(v) for v in self.slew)
        self._dims = range(len(slew))

    def limit(self, action: list[float], last: list[float]) -> list[float]:
        """``action`` moved at most ``slew`` from ``last``: ``action`` itself when nothing is limited, else a
        limited copy. Both inside the bounds gives a result inside them."""
        if not self.active:
            return action
        limited, slew = action, self.slew
        for i in self._dims:  # by index (BENCHMARKS.md "Edge: the step as stages")
            v, previous, most = action[i], last[i], slew[i]
            if v > previous + most:
                v = previous + most
            elif v < previous - most:
                v = previous - most
            else:
                continue
            if limited is action:
                limited = list(action)
            limited[i] = v
        return limited


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
    """Decides each step's action (module docstring) from the envelope test and its three components:
    ``StuckSensorDetector``, ``BlendRamp`` and ``SlewLimiter``. ``step``, ``filter_action`` and ``restart``
    come from the control thread; ``weights_swapped`` from any (it only raises a counter the control thread
    reads)."""

    def __init__(
        self,
        options: ShieldOptions,
        action_low: Sequence[float],
        action_high: Sequence[float],
        envelope: Envelope | None,
        emit: Callable[[dict[str, Any]], None] = lambda _: None,
    ) -> None:
        self.options = options
        self.envelope = envelope
        self.emit = emit
        low = [float(v) for v in action_low]
        high = [float(v) for v in action_high]
        self._bounds = list(zip(low, high))
        self.safe_action = [
            min(max(v, lo), hi) for v, (lo, hi) in zip(_safe_action(options, envelope, len(low)), self._bounds)
        ]
        self.slew = SlewLimiter(_slew(options, envelope, len(low)))
        self.ramp = BlendRamp(options.ramp_steps, self._bounds)
        self.stuck = StuckSensorDetector(options.stuck_steps)
        self._check = envelope is not None and options.shield_window > 0
        if envelope is not None:  # score = |A obs - A mean|^2 with A = W diag(1/scale)
            self._a = np.ascontiguousarray(envelope.whiten / envelope.scale[None, :])
            # the product in the observation's own dtype (the guard hands on the policy's float32): a
            # mixed-dtype product converts first (BENCHMARKS.md "Edge: the step as stages")
            self._a32 = self._a.astype(np.float32)
            self._w32 = np.empty(envelope.obs_dim, np.float32)
            self._center = (self._a @ envelope.mean).tolist()
            self._radius = math.sqrt(envelope.threshold)
            self._low, self._high = envelope.low, envelope.high
            self._obs_bounds = list(zip(envelope.low.tolist(), envelope.high.tolist()))
            self._python = envelope.obs_dim <= PYTHON_CHECK_MAX
            self._obs_shape = (envelope.obs_dim,)
            self._w = np.empty(envelope.obs_dim)
        self._out = np.array(self.safe_action, dtype=np.float32)
        self._pack = struct.Struct(f"{len(low)}f").pack_into
        self._window = max(options.shield_window, 1)
        self._swaps = 0
        self._seen_swaps = 0
        self._repeated = False
        self.counts = _Counts()
        self.steps = 0
        # the state ``restart`` resets: the action last sent, the fallback, the windows
        self._sent: list[float] = []
        self._last_clear: list[float] = []
        """The action sent at the last step whose observation was inside and clear: what ``hold`` holds."""
        self._fallback: list[float] = []
        self._outside = self._clear = 0
        self._falling_back = False
        self.restarted: list[Callable[[], None]] = []
        """Called by each ``restart`` (the runtime's observation history starts anew with the ramp)."""
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
        if not isinstance(obs, np.ndarray) or obs.shape != self._obs_shape or obs.dtype.kind not in "fiu":
            return False
        # The bounds first (over Python floats up to PYTHON_CHECK_MAX dimensions, as the guard does): a
        # non-finite value fails here (NaN compares false), so the product below only sees finite values.
        if self._python:
            for v, (lo, hi) in zip(obs.tolist(), self._obs_bounds):
                if not lo <= v <= hi:
                    return False
        elif not bool(((obs >= self._low) & (obs <= self._high)).all()):
            return False
        if obs.dtype.itemsize > 8:  # np.longdouble: the product could not write into the float64 buffer
            obs = obs.astype(np.float64)
        return self._score_inside(obs)

    def _score_inside(self, obs: np.ndarray) -> bool:
        """The Mahalanobis test of an observation already inside the envelope's bounds."""
        if obs.dtype is _FLOAT32:
            w = self._w32
            self._a32.dot(obs, out=w)  # ``out``: no temporary
        else:
            w = self._w
            self._a.dot(obs, out=w)
        return _dist(w.tolist(), self._center) <= self._radius

    def step(self, obs: object, action: np.ndarray, inferred: bool) -> np.ndarray:
        """The action to send for this step (a buffer reused by the next call): ``action`` (the guarded
        one) shaped, or the fallback; ``inferred`` is whether ``action`` was inferred for ``obs`` now."""
        values = action.tolist() if action.ndim == 1 else action.reshape(-1).tolist()
        # clipped here, as the runtime's action guard does on its path
        clipped = [hi if v > hi else lo if v < lo else v for v, (lo, hi) in zip(values, self._bounds)]
        observed = obs if isinstance(obs, np.ndarray) else None
        return self.filter_action(observed, False, clipped, inferred)

    def filter_action(
        self, observed: np.ndarray | None, inside_bounds: bool, action: list[float], inferred: bool
    ) -> np.ndarray:
        """``step`` on what the guards hand on (``safety.CheckedObservation``): ``observed`` as read (None:
        malformed), ``inside_bounds`` whether the guard found it inside ``obs_bounds`` already, and
        ``action``, the guarded action as Python floats, inside the bounds. The runtime calls this."""
        self.steps += 1
        if not self._check:
            inside = True
        elif inside_bounds:
            inside = self._score_inside(observed)  # type: ignore[arg-type]
        else:
            inside = self.inside(observed)
        if inside:
            self._outside = 0
        else:
            self._outside += 1
            self.counts.out_of_envelope += 1
        cause = None
        repeated, self._repeated = self._repeated, False
        if self.stuck.steps and not repeated and self.stuck.update(observed):
            self.counts.stuck += 1
            cause = "stuck"
        if not inferred:
            cause = "not_inferred"
        elif cause is None and self._outside >= self._window:
            cause = "envelope"
        self._follow(cause)
        if self._falling_back:
            self.counts.fallback_steps += 1
            action = self._fallback
        elif self.ramp.left:
            action = self.ramp.apply(action)
        # The fallback, a ramp's blend and the guarded action all lie inside the bounds: a limited one does too
        sent = self.slew.limit(action, self._sent)
        if sent is not action:
            self.counts.slew_limited += 1
        self._sent = sent
        if inside and cause is None:
            self._last_clear = sent
        out = self._out
        self._pack(out, 0, *sent)  # the buffer the caller sends, written from the floats in one call
        return out

    def _follow(self, cause: str | None) -> None:
        """Enter or leave the fallback for this step's ``cause`` (None: clear), and start a swap's ramp."""
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

    def _swapped(self) -> None:
        """The first step after a weight swap: the ramp from the action last sent (not while falling back)."""
        self._seen_swaps = self._swaps
        if not self._falling_back and self.ramp.start(self._sent):
            self.counts.swap_ramps += 1
            self.emit({"type": "shield", "event": "swap_ramp", "step": self.steps})

    def _enter(self, cause: str) -> None:
        counts = self.counts
        self._falling_back = True
        counts.fallbacks += 1
        counts.causes[cause] += 1
        if counts.first_fallback_step is None:
            counts.first_fallback_step = self.steps
        self._fallback = list(self._last_clear) if self.options.fallback == "hold" else list(self.safe_action)
        self.ramp.stop()
        self.emit({"type": "shield", "event": "fallback", "cause": cause, "step": self.steps})

    def _leave(self) -> None:
        self._falling_back = False
        if self.ramp.start(self._sent):
            self.counts.ramps += 1
        self.emit({"type": "shield", "event": "resume", "step": self.steps})

    # -- events from outside the step ----------------------------------------------------------------
    def same_input(self) -> None:
        """The next step's observation is one the caller has stepped on before (a timer re-stepping the latest
        message, no new data): the stuck-sensor check skips it, since a sensor repeating itself is the one
        sending the same value again."""
        self._repeated = True

    def restart(self, origin: Sequence[float] | None = None) -> None:
        """A new start (the first step, a new episode): the ramp from ``origin`` (where the plant is now, as
        an action: clipped to the bounds, the safe action's value where one is not finite), else from the
        safe action; no history."""
        start = list(self.safe_action)
        if origin is not None:
            for i, (v, (lo, hi)) in enumerate(zip(origin, self._bounds)):
                if math.isfinite(v):
                    start[i] = hi if v > hi else lo if v < lo else float(v)
        self._sent = self._last_clear = start
        self.ramp.start(start)
        for listener in self.restarted:
            listener()
        self.stuck.reset()
        self._outside = self._clear = 0
        self._falling_back = False
        self._fallback = list(self.safe_action)

    def weights_swapped(self) -> None:
        """The policy's weights changed (any thread): the next step starts the ramp from the action sent."""
        self._swaps += 1

    @property
    def falling_back(self) -> bool:
        return self._falling_back

    def summary(self) -> ShieldSummary:
        c, s = self.counts, self.options
        return dict(
            mode="on",
            envelope=self._check,
            window=s.shield_window,
            stuck_steps=s.stuck_steps,
            ramp_steps=s.ramp_steps,
            fallback=s.fallback,
            slew_limit=self.slew.active,
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


def _safe_action(options: ShieldOptions, envelope: Envelope | None, dim: int) -> list[float]:
    """The fixed fallback and the ramp's start: ``--safe-action``, else the envelope's, else zeros."""
    if options.safe_action:
        return list(options.safe_action)
    if envelope is not None:
        return [float(v) for v in envelope.safe_action.tolist()]
    return [0.0] * dim


def _slew(options: ShieldOptions, envelope: Envelope | None, dim: int) -> list[float]:
    """The slew per dimension: ``--slew`` (one value for all or one each), else the envelope's, else none."""
    if options.slew:
        return list(options.slew) * (dim if len(options.slew) == 1 else 1)
    if envelope is not None and envelope.slew is not None:
        return [float(v) for v in envelope.slew.tolist()]
    return [0.0] * dim


def guards_summary() -> ShieldSummary:
    """The summary's ``shield`` entry in ``guards`` mode (no shield ran)."""
    return {"mode": "guards"}
