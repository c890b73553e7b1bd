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

import numpy as np

OBS_FAULT_POLICIES = ("clip", "hold")


#: Up to this many components the checks run over Python floats (one ``tolist`` and a chained comparison
#: each); numpy's fixed per-call cost only pays beyond it (``bench/edge_loop.py`` times both forms).
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

    Infinite bounds are replaced by the largest finite value of their type, so one range test per
    component rejects NaN and infinities too (``lo <= v <= hi`` is false for NaN and for +-inf).

    ``inner``: narrower bounds a later check asks about (the shield's envelope bounds). The same pass
    tests both, against their intersection: ``values`` is set only for an observation inside them too,
    and one outside them but inside the declared bounds takes a second pass (it is still fine).
    """

    def __init__(
        self,
        low: np.ndarray,
        high: np.ndarray,
        policy: str = "clip",
        inner: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        if policy not in OBS_FAULT_POLICIES:
            raise ValueError(f"obs fault policy must be one of {OBS_FAULT_POLICIES}, got {policy!r}")
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        self.hold = policy == "hold"
        big = float(np.finfo(np.float64).max)
        self._low, self._high = np.maximum(self.low, -big), np.minimum(self.high, big)
        self._bounds = list(zip(self._low.reshape(-1).tolist(), self._high.reshape(-1).tolist()))
        self._python = self.low.size <= PYTHON_CHECK_MAX
        self._inner = inner is not None
        self._both = self._bounds  # the declared bounds intersected with ``inner``: the first pass
        if inner is not None:
            low_in = np.maximum(self._low, np.asarray(inner[0], dtype=np.float64)).reshape(-1).tolist()
            high_in = np.minimum(self._high, np.asarray(inner[1], dtype=np.float64)).reshape(-1).tolist()
            self._both = list(zip(low_in, high_in))
        self.last_good = np.clip(np.zeros_like(self.low), self.low, self.high)
        self._last: list[float] | None = None  # the last good values when checked as Python floats
        self.values: list[float] | None = None
        """The observation ``check`` last returned unchanged, as Python floats, when it also lies inside
        ``inner`` (None otherwise, or when the guard checks with numpy): the shield reads it instead of
        converting and testing the bounds again."""
        self._flat = len(self.low.shape) == 1  # a 1-D observation lists itself without a reshape
        self._repaired = np.empty_like(self.low)
        self.nonfinite = 0
        self.out_of_range = 0
        self.malformed = 0

    def well_formed(self, obs: object) -> bool:
        """Whether ``obs`` is an array of real numbers of the declared shape (values not yet checked)."""
        return isinstance(obs, np.ndarray) and obs.shape == self.low.shape and obs.dtype.kind in "fiu"

    def fine(self, obs: object) -> bool:
        """Whether ``obs`` is well formed, finite and inside the bounds (no side effects)."""
        if not self.well_formed(obs):
            return False
        assert isinstance(obs, np.ndarray)
        if self._python:
            return _inside(obs.reshape(-1).tolist(), self._bounds)
        return self._array_in_bounds(obs)

    def _array_in_bounds(self, obs: np.ndarray) -> bool:
        return bool(((obs >= self._low) & (obs <= self._high)).all())

    def check(self, obs: np.ndarray) -> np.ndarray | None:
        """A safe observation (``obs`` itself when it is fine), or None: hold the last action."""
        if not self.well_formed(obs):
            self.malformed += 1
            self.values = None
            return None if self.hold else self._last_good().copy()
        if self._python:
            values = obs.tolist() if self._flat else obs.reshape(-1).tolist()
            if _inside(values, self._both):
                self._last = self.values = values  # a copy taken by tolist: the env may reuse its array
                return obs
            if self._inner and _inside(values, self._bounds):  # fine, outside the inner bounds alone
                self._last, self.values = values, None
                return obs
        elif self._array_in_bounds(obs):  # well formed: checked above
            np.copyto(self.last_good, obs)
            return obs
        self.values = None
        if not bool(np.isfinite(obs).all()):
            self.nonfinite += 1
        else:
            self.out_of_range += 1
        if self.hold:
            return None
        repaired = self._repaired
        np.copyto(repaired, obs)
        bad = ~np.isfinite(repaired)
        repaired[bad] = self._last_good()[bad]
        np.clip(repaired, self.low, self.high, out=repaired)
        np.copyto(self.last_good, repaired)
        self._last = None
        return repaired

    def _last_good(self) -> np.ndarray:
        """The last good observation as an array (kept as Python floats on the fast path)."""
        if self._last is not None:
            self.last_good[...] = np.reshape(self._last, self.last_good.shape)
            self._last = None
        return self.last_good


def _inside(values: list[float], bounds: list[tuple[float, float]]) -> bool:
    """Whether every value lies in its ``(low, high)``: one chained comparison each, false for NaN."""
    for v, (lo, hi) in zip(values, bounds):  # noqa: SIM110 (all() over a generator: ~2x the time)
        if not lo <= v <= hi:
            return False
    return True


class ActionGuard:
    """Keeps every action finite and inside ``[low, high]``; remembers the last safe one."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self._out = np.clip(np.zeros_like(self.low), self.low, self.high)
        self._scratch = self._out.copy()  # what ``rehearse`` writes
        self._safe = self._out.tolist()  # the last safe action, as Python floats
        # struct's pack_into writes the floats into the buffer at a third less than numpy's item assignment
        self._pack = struct.Struct(f"{self._out.size}f").pack_into
        self._bounds = list(zip(self.low.tolist(), self.high.tolist()))
        self.nonfinite = 0
        self.clipped = 0

    def clip(self, action: np.ndarray) -> tuple[list[float], bool] | None:
        """``action`` as Python floats clipped to the bounds and whether any was clipped, or None when one
        is not finite. No side effects: the loop also calls it to warm the step before its slot.

        Written over Python floats: for the few dimensions of an action this is one conversion and a
        comparison per element, several times cheaper than the numpy form's five calls (isfinite, two
        range tests, clip, copy).
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

    def rehearse(self, action: np.ndarray) -> None:
        """``apply``'s work without its effects (counters, the last safe action, the output buffer): the
        loop runs it just before the slot so that the code and data ``apply`` touches are in the caches."""
        checked = self.clip(action)
        if checked is not None:
            self._pack(self._scratch, 0, *checked[0])

    def hold(self) -> np.ndarray:
        """The last safe action (for a skipped or overrun inference)."""
        out = self._out
        self._pack(out, 0, *self._safe)
        return out
