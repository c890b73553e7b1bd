from __future__ import annotations

import numpy as np
import pytest

from sac_edge.calibration.calibrators import amax_entropy, amax_minmax, amax_percentile, compute_amax
from sac_edge.common.errors import SacEdgeError


def test_minmax_is_exact() -> None:
    assert amax_minmax(np.array([[-3.5, 1.0], [2.0, 0.25]], np.float32)) == 3.5
    assert amax_minmax(np.zeros(4)) == 0.0


def test_percentile_clips_outliers() -> None:
    data = np.concatenate([np.linspace(-1, 1, 100_000), [50.0]]).astype(np.float32)
    assert amax_percentile(data, 99.99) == pytest.approx(np.percentile(np.abs(data), 99.99))
    assert amax_percentile(data, 99.99) < 1.01
    assert amax_percentile(data, 100.0) == 50.0
    with pytest.raises(SacEdgeError):
        amax_percentile(data, 0.0)


def test_entropy_on_gaussian_clips_the_tail_only() -> None:
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    top = amax_minmax(x)
    amax = amax_entropy(x)
    assert 2.5 < amax < top  # clips a few outliers, keeps the bulk (|x| < 2.5 sigma holds 98.8%)
    relu = amax_entropy(np.maximum(x, 0.0))  # the zero spike of a ReLU must not pull it down
    assert 2.5 < relu <= amax_minmax(np.maximum(x, 0.0))


def test_entropy_keeps_full_range_of_uniform_data() -> None:
    x = np.random.default_rng(1).uniform(-1, 1, 100_000)
    assert amax_entropy(x) == pytest.approx(1.0, abs=0.01)


def test_compute_amax_per_tensor_overrides() -> None:
    acts = {"a": np.array([1.0, -4.0]), "b": np.linspace(0, 10, 10_001)}
    out = compute_amax(acts, "minmax", overrides={"b": "percentile"}, percentile=50.0)
    assert out == {"a": 4.0, "b": pytest.approx(5.0)}
    with pytest.raises(SacEdgeError, match="unknown"):
        compute_amax(acts, "kl")
    with pytest.raises(SacEdgeError, match="not calibrated"):
        compute_amax(acts, "minmax", overrides={"c": "minmax"})
