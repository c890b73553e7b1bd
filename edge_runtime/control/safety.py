"""The control loop's safety policy for observations and actions (counted, never silent).

Observation (``--obs-fault``):

- ``clip`` (default): each non-finite component is replaced by its last good value (0 before any good
  one), then the observation is clipped to the declared observation-space bounds; the policy then runs
  on the repaired observation. Keeps the controller responsive when one sensor channel glitches.
- ``hold``: any non-finite or out-of-range observation skips inference and holds the last safe action.
  The conservative choice for a plant where a stale command is safer than a guessed state.

A malformed observation (not an array of real numbers of the declared shape: a wrong shape, a scalar, an
object or string dtype) is an observation fault too, counted as ``malformed``: ``clip`` serves the last
good observation, ``hold`` holds the last safe action. It is never broadcast or passed to the policy.

Action: always finite and inside the action bounds. A non-finite action is replaced by the last safe
action (initially 0 clipped to the bounds); a finite one is clipped to the bounds.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Optional, Tuple

import numpy as np

OBS_FAULT_POLICIES = ("clip", "hold")

CheckedObservation = Tuple[Optional[np.ndarray], Optional[np.ndarray], bool]
"""What ``ObservationGuard.check`` hands on, in the policy's dtype: ``observed``, the observation as read
(None when malformed: not an array of real numbers of the declared shape), for the checks that judge the
sensors (the shield's envelope and stuck-sensor tests); ``safe``, what the policy infers on (``observed``
itself when it is fine, a repaired copy, or None: hold the last safe action); ``inside``, whether
``observed`` lies inside the guard's ``inner`` bounds too (the shield then skips its own bounds test)."""


#: Up to this many components the checks run over Python floats (one ``tolist`` and a chained comparison
#: each); numpy's form is used beyond it (BENCHMARKS.md "Edge: the step as stages").
PYTHON_CHECK_MAX = 64


def plain_array(obs: object) -> object:
    """A numpy subclass instance as a plain array, anything else as it is (the guard judges it).

    A masked array's masked entries become NaN (a reading that is missing is a non-finite one, repaired
    or held by the policy); other subclasses (``np.matrix``, say) would reshape or list themselves in their
    own way inside the guard. A conversion that raises (foreign code) gives None, a malformed observation.
    """
    if type(obs) is np.ndarray or not isinstance(obs, np.ndarray):
        return obs
    try:
        if isinstance(obs, np.ma.MaskedArray):
            return np.ma.filled(obs.astype(np.float64), np.nan)
        return np.array(obs, subok=False)
    except Exception:
        return None


class ObservationGuard:
    """Checks each observation against finiteness and the declared bounds, repairing per the policy.

    Infinite bounds are replaced by the largest finite value of the policy's dtype, so one range test per
    component rejects NaN and infinities too (``lo <= v <= hi`` is false for NaN and for +-inf), and a value
    the policy's dtype cannot hold is out of range rather than an infinity after the conversion.

    ``dtype``: the policy's input dtype. Every observation of a real dtype (float16 to ``np.longdouble``,
    signed and unsigned integers) is converted to it once, here, so that no later stage meets another dtype
    (the shield's envelope score writes into float64 buffers; a ``np.longdouble`` product cannot).
    None keeps the observation's own dtype.

    ``inner``: narrower bounds a later check asks about (the shield's envelope bounds). The same pass
    tests both, against their intersection: ``check`` says whether the observation lies inside them too,
    and one outside them but inside the declared bounds takes a second pass (it is still fine).
    """

    def __init__(
        self,
        low: np.ndarray,
        high: np.ndarray,
        policy: str = "clip",
        inner: tuple[np.ndarray, np.ndarray] | None = None,
        dtype: np.dtype[Any] | type | None = None,
    ) -> None:
        if policy not in OBS_FAULT_POLICIES:
            raise ValueError(f"obs fault policy must be one of {OBS_FAULT_POLICIES}, got {policy!r}")
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        self.hold = policy == "hold"
        self.dtype = None if dtype is None else np.dtype(dtype)
        big = float(np.finfo(np.float64 if self.dtype is None or self.dtype.kind != "f" else self.dtype).max)
        self._low, self._high = np.maximum(self.low, -big), np.minimum(self.high, big)
        self._bounds = list(zip(self._low.reshape(-1).tolist(), self._high.reshape(-1).tolist()))
        self._python = self.low.size <= PYTHON_CHECK_MAX
        self._inner = inner is not None
        self._both = self._bounds  # the declared bounds intersected with ``inner``: the first pass
        if inner is not None:
            low_in = np.maximum(self._low, np.asarray(inner[0], dtype=np.float64)).reshape(-1).tolist()
            high_in = np.minimum(self._high, np.asarray(inner[1], dtype=np.float64)).reshape(-1).tolist()
            self._both = list(zip(low_in, high_in))
        self.last_good = np.clip(np.zeros_like(self.low), self._low, self._high)
        self._last: list[float] | None = None  # the last good values when checked as Python floats
        self._flat = len(self.low.shape) == 1  # a 1-D observation lists itself without a reshape
        self._repaired = np.empty_like(self.low)
        self.nonfinite = 0
        self.out_of_range = 0
        self.malformed = 0

    def well_formed(self, obs: object) -> bool:
        """Whether ``obs`` is an array of real numbers of the declared shape (values not yet checked)."""
        return isinstance(obs, np.ndarray) and obs.shape == self.low.shape and obs.dtype.kind in "fiu"

    def check(self, obs: np.ndarray) -> CheckedObservation:
        """The observation as the later stages take it: ``(observed, safe, inside)`` (``CheckedObservation``)."""
        if not self.well_formed(obs):
            self.malformed += 1
            return None, (None if self.hold else self._converted(self._last_good().copy())), False
        if self._python:
            values = obs.tolist() if self._flat else obs.reshape(-1).tolist()
            if _inside(values, self._both):
                self._last = values  # a copy taken by tolist: the env may reuse its array
                if obs.dtype is not self.dtype and self.dtype is not None:
                    obs = obs.astype(self.dtype)  # in range: the conversion cannot overflow
                return obs, obs, self._inner
            if self._inner and _inside(values, self._bounds):  # fine, outside the inner bounds alone
                self._last = values
                if obs.dtype is not self.dtype and self.dtype is not None:
                    obs = obs.astype(self.dtype)
                return obs, obs, False
        elif self._array_in_bounds(obs):  # well formed: checked above
            np.copyto(self.last_good, obs)
            obs = self._converted(obs)
            return obs, obs, False
        return self._fault(obs)

    def _fault(self, obs: np.ndarray) -> CheckedObservation:
        """``check`` for a well-formed observation outside the bounds: counted, then held or repaired."""
        with np.errstate(over="ignore", invalid="ignore"):  # a float128 beyond the policy's dtype: +-inf
            observed = self._converted(obs)
            finite = bool(np.isfinite(obs).all())
            if finite:
                self.out_of_range += 1
            else:
                self.nonfinite += 1
            if self.hold:
                return observed, None, False
            repaired = self._repaired
            np.copyto(repaired, obs, casting="unsafe")
        bad = ~np.isfinite(repaired)
        repaired[bad] = self._last_good()[bad]
        np.clip(repaired, self._low, self._high, out=repaired)
        np.copyto(self.last_good, repaired)
        self._last = None
        return observed, self._converted(repaired), False

    def _converted(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` in the policy's dtype (itself when it has it)."""
        if self.dtype is None or obs.dtype is self.dtype:
            return obs
        return obs.astype(self.dtype)

    def _array_in_bounds(self, obs: np.ndarray) -> bool:
        return bool(((obs >= self._low) & (obs <= self._high)).all())

    def _last_good(self) -> np.ndarray:
        """The last good observation as an array (kept as Python floats on the fast path)."""
        if self._last is not None:
            self.last_good[...] = np.reshape(np.asarray(self._last, np.float64), self.last_good.shape)
            self._last = None
        return self.last_good


def _inside(values: list[float], bounds: list[tuple[float, float]]) -> bool:
    """Whether every value lies in its ``(low, high)``: one chained comparison each, false for NaN."""
    for v, (lo, hi) in zip(values, bounds):  # noqa: SIM110 (a plain loop: BENCHMARKS.md "Edge: the step as stages")
        if not lo <= v <= hi:
            return False
    return True


class ActionGuard:
    """Keeps every action finite and inside ``[low, high]``; remembers the last safe one."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self._out = np.clip(np.zeros_like(self.low), self.low, self.high)
        self._safe = self._out.tolist()  # the last safe action, as Python floats
        # the output buffer, written from the Python floats in one call
        self._pack = struct.Struct(f"{self._out.size}f").pack_into
        self._bounds = list(zip(self.low.tolist(), self.high.tolist()))
        self.nonfinite = 0
        self.clipped = 0

    def clip(self, action: np.ndarray) -> tuple[list[float], bool] | None:
        """``action`` as Python floats clipped to the bounds and whether any was clipped, or None when one
        is not finite. No side effects.

        Written over Python floats, one conversion and a comparison per element: the cheaper form at an
        action's few dimensions (BENCHMARKS.md "Edge: the step as stages").
        """
        values = action.tolist() if action.ndim == 1 else action.reshape(-1).tolist()
        clipped = False
        for i, (v, (lo, hi)) in enumerate(zip(values, self._bounds)):
            if not lo <= v <= hi:  # also true for NaN
                if not math.isfinite(v):
                    return None
                clipped, values[i] = True, (lo if v < lo else hi)
        return values, clipped

    def apply(self, action: np.ndarray) -> np.ndarray:
        """The action to send (a reused buffer): ``action`` clipped, or the last safe one if not finite."""
        out = self._out
        self._pack(out, 0, *self.take(action))
        return out

    def take(self, action: np.ndarray) -> list[float]:
        """``apply`` without the write: the action to send as Python floats, for the shield to shape."""
        checked = self.clip(action)
        if checked is None:
            self.nonfinite += 1
            return self._safe
        values, clipped = checked
        if clipped:
            self.clipped += 1
        self._safe = values
        return values

    @property
    def safe(self) -> list[float]:
        """The last safe action as Python floats (what ``hold`` writes)."""
        return self._safe

    def hold(self) -> np.ndarray:
        """The last safe action (for a skipped or overrun inference)."""
        out = self._out
        self._pack(out, 0, *self._safe)
        return out
