"""The envelope sac-export fits: its threshold meets the stated false-positive rate on held-out states, it
rejects what lies off the training distribution, and its file round-trips through the runtime's parser."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.envelope import parse_envelope
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.export.envelope import fit_envelope

SPEC = PolicySpec(env_id="", obs_dim=4, act_dim=2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0), hidden=(8,))


def correlated_states(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n, 2))
    return np.column_stack([base[:, 0], base[:, 0] + 0.1 * base[:, 1], 3.0 + base[:, 1], 5.0 * base[:, 0]])


def test_threshold_meets_the_rate_and_off_distribution_states_are_outside() -> None:
    states = correlated_states(20_000, 0)
    changes = np.abs(np.random.default_rng(1).normal(0, 0.1, (500, 2)))
    envelope = fit_envelope(states, SPEC, margin=0.1, fpr=0.01, seed=0, action_changes=changes)
    assert envelope.facts["holdout_states"] == 4000 and envelope.facts["fit_states"] == 16_000
    assert envelope.facts["holdout_false_positive_rate"] <= 0.02
    fresh = correlated_states(20_000, 2)  # states the fit never saw, from the same distribution
    assert 1 - envelope.inside(fresh).mean() <= 0.02
    # one dimension a few sigma off while inside its own bounds: the correlation gives it away
    off = fresh[:1000].copy()
    off[:, 1] = -off[:, 0]
    assert envelope.inside(off).mean() < 0.1
    nan = fresh[:3].copy()
    nan[0, 0], nan[1, 2], nan[2, 3] = np.nan, np.inf, -np.inf
    assert not envelope.inside(nan).any()
    assert envelope.slew is not None and np.all(envelope.slew >= 0.05 * np.array([2.0, 4.0]))
    np.testing.assert_array_equal(envelope.safe_action, [0.0, 0.0])


def test_the_file_round_trips_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    envelope = fit_envelope(correlated_states(2000, 0), SPEC, margin=0.0, fpr=0.05, seed=3)
    raw = json.dumps(envelope.to_dict()).encode()
    back = parse_envelope(raw, tmp_path / "envelope.json", SPEC.obs_dim, SPEC.act_dim)
    np.testing.assert_array_equal(back.whiten, envelope.whiten)
    assert back.threshold == envelope.threshold and back.slew is None
    with pytest.raises(SacEdgeError, match="low must be 5"):
        parse_envelope(raw, tmp_path / "envelope.json", 5, SPEC.act_dim)
    for key, value in (("threshold", float("nan")), ("scale", [0.0] * 4), ("whiten", [[1.0]]), ("format", "x")):
        bad = json.dumps({**envelope.to_dict(), key: value}).encode()
        with pytest.raises(SacEdgeError, match="re-export"):
            parse_envelope(bad, tmp_path / "envelope.json", SPEC.obs_dim, SPEC.act_dim)
