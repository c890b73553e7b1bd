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

import numpy as np

OBS_FAULT_POLICIES = ("clip", "hold")


class ObservationGuard:
    """Checks each observation against finiteness and the declared bounds, repairing per the policy."""

    def __init__(self, low: np.ndarray, high: np.ndarray, policy: str = "clip") -> None:
        if policy not in OBS_FAULT_POLICIES:
            raise ValueError(f"obs fault policy must be one of {OBS_FAULT_POLICIES}, got {policy!r}")
        self.low = np.asarray(low, dtype=np.float64)
        self.high = np.asarray(high, dtype=np.float64)
        self.bounded = bool(np.isfinite(self.low).any() or np.isfinite(self.high).any())
        self.hold = policy == "hold"
        self.last_good = np.clip(np.zeros_like(self.low), self.low, self.high)
        self._repaired = np.empty_like(self.low)
        self.nonfinite = 0
        self.out_of_range = 0
        self.malformed = 0

    def well_formed(self, obs: object) -> bool:
        """Whether ``obs`` is an array of real numbers of the declared shape (values not yet checked)."""
        return isinstance(obs, np.ndarray) and obs.shape == self.low.shape and obs.dtype.kind in "fiu"

    def check(self, obs: np.ndarray) -> np.ndarray | None:
        """A safe observation (``obs`` itself when it is fine), or None: hold the last action."""
        if not self.well_formed(obs):
            self.malformed += 1
            return None if self.hold else self.last_good.copy()
        finite = bool(np.isfinite(obs).all())
        if finite and (not self.bounded or bool(((obs >= self.low) & (obs <= self.high)).all())):
            np.copyto(self.last_good, obs)
            return obs
        if not finite:
            self.nonfinite += 1
        else:
            self.out_of_range += 1
        if self.hold:
            return None
        repaired = self._repaired
        np.copyto(repaired, obs)
        bad = ~np.isfinite(repaired)
        repaired[bad] = self.last_good[bad]
        np.clip(repaired, self.low, self.high, out=repaired)
        np.copyto(self.last_good, repaired)
        return repaired


class ActionGuard:
    """Keeps every action finite and inside ``[low, high]``; remembers the last safe one."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.low = np.asarray(low, dtype=np.float32)
        self.high = np.asarray(high, dtype=np.float32)
        self.safe = np.clip(np.zeros_like(self.low), self.low, self.high)
        self._out = self.safe.copy()
        self._bounds = list(zip(self.low.tolist(), self.high.tolist()))
        self.nonfinite = 0
        self.clipped = 0

    def apply(self, action: np.ndarray) -> np.ndarray:
        """The action to send (a reused buffer): ``action`` clipped, or the last safe one if not finite.

        Written over Python floats: for the few dimensions of an action this is one conversion and a
        comparison per element (about 2.5 us), where the numpy form (isfinite, two range tests, clip,
        copy) cost about 13 us a step in ``bench/edge_loop.py``'s loop.
        """
        values = []
        clipped = False
        for v, (lo, hi) in zip(action.reshape(-1).tolist(), self._bounds):
            if not lo <= v <= hi:  # also true for NaN
                if not math.isfinite(v):
                    self.nonfinite += 1
                    return self.hold()
                clipped, v = True, (lo if v < lo else hi)
            values.append(v)
        self.clipped += clipped
        self._out[:] = values
        self.safe[:] = self._out
        return self._out

    def hold(self) -> np.ndarray:
        """The last safe action (for a skipped or overrun inference)."""
        np.copyto(self._out, self.safe)
        return self._out
