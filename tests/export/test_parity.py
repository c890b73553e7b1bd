"""Parity: held-out states are not the calibration rows, and a disagreeing graph fails with exit 1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.errors import InternalError
from sac_edge.export.onnx_export import export_policy
from sac_edge.export.parity import held_out_states, measure_parity, require_parity
from sac_edge.export.source import load_source


def test_held_out_states_are_not_calibration_rows(pendulum_run: Path, tmp_path: Path) -> None:
    source = load_source(str(pendulum_run))
    assert source.replay_states is not None
    states, origin = held_out_states(source.replay_states, tmp_path / "unused.onnx", source.spec, 10_000, seed=0)
    assert states.shape == (10_000, 3) and states.dtype == np.float32 and np.all(np.isfinite(states))
    calib = {row.tobytes() for row in source.replay_states}
    assert not any(row.tobytes() in calib for row in states)
    assert "perturbed" in origin


def test_parity_passes_and_a_wrong_graph_fails(pendulum_run: Path, tmp_path: Path) -> None:
    source = load_source(str(pendulum_run))
    onnx_path = tmp_path / "policy.onnx"
    export_policy(source.policy, 3, onnx_path)
    assert source.replay_states is not None
    states, origin = held_out_states(source.replay_states, onnx_path, source.spec, 2_000, seed=1)
    good = measure_parity(onnx_path, source.reference, "torch", states, origin)
    assert good.passed and good.max_abs <= 1e-5 and good.mean_abs <= good.max_abs
    require_parity(good)

    def off_by_a_bit(obs: np.ndarray) -> np.ndarray:
        return source.reference(obs) + 1e-4

    bad = measure_parity(onnx_path, off_by_a_bit, "shifted", states, origin)
    assert not bad.passed and bad.max_abs == pytest.approx(1e-4, rel=0.05)
    with pytest.raises(InternalError, match="parity failed") as exc:
        require_parity(bad)
    assert exc.value.exit_code == 1


def _wide_policy(obs_dim: int, seed: int):
    """A 256x256 actor on a wide input (3 frame values, 3 last actions, 3 frames of history: 15), with a
    normaliser whose small deviations blow inputs up to the clip: where a fixed 1e-5 refused correct exports."""
    import torch

    from sac_edge.train.policies import OBS_CLIP, Actor, InferencePolicy, ObsNormalizer

    torch.manual_seed(seed)
    norm = ObsNormalizer(obs_dim, clip=OBS_CLIP)
    norm.update(torch.randn(512, obs_dim) * torch.linspace(0.01, 3.0, obs_dim))
    return InferencePolicy(Actor(obs_dim, 1, (256, 256)), norm, torch.tensor([-2.0]), torch.tensor([2.0]))


def test_the_derived_tolerance_passes_correct_wide_exports_and_refuses_wrong_ones(tmp_path: Path) -> None:
    """Issue 51: the tolerance follows the network (widths, weights, inputs), so every correct export of a
    wide-input policy passes with room, and an export that is off (its fp16 graph, a normaliser off by a
    thousandth of a deviation) is still refused."""
    from sac_edge.export.fp16_onnx import write_fp16
    from sac_edge.export.parity import derived_tolerance
    from sac_edge.export.source import torch_reference

    rng = np.random.default_rng(0)
    for seed in range(3):
        policy = _wide_policy(15, seed)
        onnx_path = tmp_path / f"policy{seed}.onnx"
        export_policy(policy, 15, onnx_path)
        states = (rng.standard_normal((2_000, 15)) * 3).astype(np.float32)
        tol = derived_tolerance(policy, states)
        good = measure_parity(onnx_path, torch_reference(policy), "torch", states, "test", tol)
        assert good.passed and good.max_abs * 5 <= tol, (good.max_abs, tol)
    write_fp16(onnx_path, tmp_path / "fp16.onnx", "obs", "action")
    fp16 = measure_parity(tmp_path / "fp16.onnx", torch_reference(policy), "torch", states, "test", tol)
    assert not fp16.passed
    policy.obs_mean += 1e-3 / policy.obs_inv_std  # the normaliser off by a thousandth of a deviation
    shifted = measure_parity(onnx_path, torch_reference(policy), "torch", states, "test", tol)
    assert not shifted.passed
