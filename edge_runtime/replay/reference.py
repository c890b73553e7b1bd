"""What the policy was trained on, per observation slot, from a verified bundle: the held-out training
states sac-export keeps (``parity_states.npy``) and the envelope's bounds (``envelope.json``)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from sac_edge.common.bundle_format import ENVELOPE, ENVELOPE_KIND, PARITY_STATES_KIND
from sac_edge.common.envelope import Envelope, parse_envelope
from sac_edge.common.errors import SacEdgeError

#: Bounds from the training states alone (no envelope): these quantiles, widened by MARGIN of their width
#: on each side, as sac-export fits the envelope's.
QUANTILES = (0.001, 0.999)
MARGIN = 0.1


@dataclass(frozen=True)
class Reference:
    """The training distribution per observation slot: ``low``/``high`` (the range a value is in range
    within), ``spread`` (its standard deviation, 0 for a constant slot) and, with training states, the
    states themselves (for which training slot a recorded channel resembles)."""

    low: np.ndarray
    high: np.ndarray
    spread: np.ndarray
    states: np.ndarray | None
    envelope: Envelope | None
    source: str


def no_reference(obs_dim: int) -> Reference:
    """For a bundle with neither training states nor an envelope (shadow mode still compares commands): no
    range to be out of, every slot taken to move."""
    inf = np.full(obs_dim, np.inf)
    return Reference(-inf, inf, np.ones(obs_dim), None, None, "none (the bundle has no training states)")


def bundle_reference(bundle: Any) -> Reference:
    """The ``Reference`` of a verified bundle (``common.bundle.Bundle``): its training states and envelope;
    one line when it has neither (a bundle exported before sac-export kept them)."""
    spec = bundle.spec
    states = envelope = None
    names = bundle.files(PARITY_STATES_KIND)
    if names:
        states = np.load(io.BytesIO(bundle.read(bundle.path / names[0])), allow_pickle=False)
        if states.ndim != 2 or states.shape[1] != spec.obs_dim or not len(states):
            raise SacEdgeError(f"{bundle.path / names[0]}: training states have shape {states.shape}; re-export")
        states = states.astype(np.float64)
        states = states[np.isfinite(states).all(axis=1)]
    names = bundle.files(ENVELOPE_KIND)
    if names:
        path = bundle.path / names[0]
        envelope = parse_envelope(bundle.read(path), path, spec.obs_dim, spec.act_dim)
    if envelope is not None:
        low, high = envelope.low, envelope.high
        spread = np.std(states, axis=0) if states is not None else envelope.scale
        source = ENVELOPE + (" and the training states" if states is not None else "")
    elif states is not None and len(states):
        q_low, q_high = np.quantile(states, QUANTILES[0], axis=0), np.quantile(states, QUANTILES[1], axis=0)
        width = q_high - q_low
        low, high, spread = q_low - MARGIN * width, q_high + MARGIN * width, np.std(states, axis=0)
        source = "the training states"
    else:
        raise SacEdgeError(
            f"{bundle.path}: the bundle holds no training states nor envelope to compare a recording with; "
            "re-export it with sac-export (it keeps both)"
        )
    return Reference(low, high, spread, states, envelope, source)
