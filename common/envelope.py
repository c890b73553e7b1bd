"""The observation envelope a bundle carries (``envelope.json``): where the training data lies.

``sac-export`` computes it (``export/envelope.py``) and the runtime's shield checks every observation
against it (``edge_runtime/control/shield.py``). Two tests, both on the raw observation:

- per-dimension bounds ``low``/``high``: a low and a high quantile of the training states, widened on each
  side by ``margin`` times the distance between them;
- a Mahalanobis distance in the normalised observation space: ``z = (obs - mean) / scale``, then
  ``score = |W z|^2`` with ``W`` the inverse Cholesky factor of the covariance of ``z`` (ridge-regularised),
  against ``threshold``: the ``1 - false_positive_rate`` quantile of the scores of held-out training states.

The file also carries the action shaping defaults derived at export: ``slew`` (the largest step-to-step
action change per dimension the exported policy made in seeded rollouts, widened; ``None`` without
rollouts) and ``safe_action`` (the fixed fallback action). Parsing is strict: a file the runtime reads is
covered by the manifest's checksums, but a bundle is still untrusted input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import SacEdgeError
from .jsonfile import parse_json_object

FORMAT = "sac-edge envelope/1"
FIX = "re-export the bundle with sac-export"


@dataclass(frozen=True)
class Envelope:
    """The envelope of one bundle (module docstring); arrays are float64, read-only by convention."""

    low: np.ndarray
    high: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    whiten: np.ndarray
    """``[obs_dim, obs_dim]``, lower triangular."""
    threshold: float
    slew: np.ndarray | None
    safe_action: np.ndarray
    facts: dict[str, Any]
    """How it was made (quantile, margin, false-positive rate asked and measured, state counts, sources)."""

    @property
    def obs_dim(self) -> int:
        return int(self.low.shape[0])

    def scores(self, states: np.ndarray) -> np.ndarray:
        """The Mahalanobis scores of ``states`` ``[n, obs_dim]`` (float64 ``[n]``; NaN rows give NaN)."""
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite row scores NaN or inf, quietly
            z = (np.asarray(states, dtype=np.float64) - self.mean) / self.scale
            w = z @ self.whiten.T
            return np.einsum("ij,ij->i", w, w)

    def inside(self, states: np.ndarray) -> np.ndarray:
        """Whether each row of ``states`` is inside both the bounds and the score threshold."""
        states = np.asarray(states, dtype=np.float64)
        bounds = ((states >= self.low) & (states <= self.high)).all(axis=1)
        return bounds & (self.scores(states) <= self.threshold)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "obs_dim": self.obs_dim,
            "act_dim": int(self.safe_action.shape[0]),
            "low": self.low.tolist(),
            "high": self.high.tolist(),
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "whiten": self.whiten.tolist(),
            "threshold": self.threshold,
            "slew": None if self.slew is None else self.slew.tolist(),
            "safe_action": self.safe_action.tolist(),
            "facts": self.facts,
        }


def parse_envelope(raw: bytes, path: Path, obs_dim: int, act_dim: int) -> Envelope:
    """The envelope in ``raw`` (the verified bytes of ``path``), checked against the bundle's dims; any
    deviation is one SacEdgeError line."""
    data = parse_json_object(raw, path, "observation envelope", FIX)
    if data.get("format") != FORMAT:
        raise SacEdgeError(f"{path}: not a {FORMAT} file (format {data.get('format')!r}); {FIX}")

    def vector(key: str, size: int, positive: bool = False) -> np.ndarray:
        try:
            arr = np.asarray(data.get(key), dtype=np.float64)
        except (TypeError, ValueError):
            arr = np.empty(0)
        if arr.shape != (size,) or not np.isfinite(arr).all() or (positive and not (arr > 0).all()):
            what = "positive" if positive else "finite"
            raise SacEdgeError(f"{path}: {key} must be {size} {what} numbers; {FIX}")
        return arr

    low, high = vector("low", obs_dim), vector("high", obs_dim)
    if not (low <= high).all():
        raise SacEdgeError(f"{path}: low must not exceed high in any dimension; {FIX}")
    try:
        whiten = np.asarray(data.get("whiten"), dtype=np.float64)
    except (TypeError, ValueError):
        whiten = np.empty(0)
    if whiten.shape != (obs_dim, obs_dim) or not np.isfinite(whiten).all():
        raise SacEdgeError(f"{path}: whiten must be a {obs_dim}x{obs_dim} matrix of finite numbers; {FIX}")
    threshold = data.get("threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < math.inf:
        raise SacEdgeError(f"{path}: threshold must be a positive number; {FIX}")
    slew = None if data.get("slew") is None else vector("slew", act_dim, positive=True)
    facts = data.get("facts")
    return Envelope(
        low,
        high,
        vector("mean", obs_dim),
        vector("scale", obs_dim, positive=True),
        whiten,
        float(threshold),
        slew,
        vector("safe_action", act_dim),
        facts if isinstance(facts, dict) else {},
    )
