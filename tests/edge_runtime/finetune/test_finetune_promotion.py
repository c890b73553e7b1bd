"""Candidates: shadow check, promotion saved atomically, rollback on a planted regression."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from finetune_bundles import make_tuner
from sac_edge.common.manifest import sha256_file
from sac_edge.edge_runtime.finetune.experience import EpisodeLog, EpisodeRecord
from sac_edge.edge_runtime.finetune.finetuner import FineTuner
from sac_edge.edge_runtime.finetune.learner_process import N_STATES, STATES
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore, judge, shadow_check

WINDOW = 3


def _tuner(bundle_dir: Path, tmp_path: Path, **overrides: Any) -> tuple[FineTuner, Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    tuner, backend = make_tuner(bundle_dir, tmp_path, events.append, promotion_window=WINDOW, **overrides)
    verdicts: list[str] = []
    tuner.learner.resolve = verdicts.append  # type: ignore[method-assign]  # what the learner process is told
    tuner.verdicts = verdicts  # type: ignore[attr-defined]
    return tuner, backend, events


def _episodes(tuner: FineTuner, generation: int, value: float) -> None:
    for _ in range(WINDOW):
        tuner.episodes.finished.append(EpisodeRecord(generation, value, 200))
    tuner._review()


def _plant(tuner: FineTuner, weights: dict[str, np.ndarray]) -> None:
    """What the learner process does with a checked candidate: the state in shared memory, then a message."""
    states = np.random.default_rng(0).normal(0, 1, (64, tuner.spec.obs_dim)).astype(np.float32)
    tuner.learner.weights.write({**tuner.good_state, **weights})
    tuner.learner.weights[STATES][: len(states)] = states
    tuner.learner.weights[N_STATES][...] = len(states)
    tuner._on_message({"kind": "candidate", "updates": 20, "collected": 300, "shadow": None})


@pytest.fixture(autouse=True)
def _stop_learners(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every tuner a test builds stops its learner process."""
    tuners: list[FineTuner] = []
    init = FineTuner.__init__

    def tracked(self: FineTuner, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        tuners.append(self)

    monkeypatch.setattr(FineTuner, "__init__", tracked)
    yield
    for tuner in tuners:
        tuner.stop()


def test_planted_regression_is_rolled_back(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, backend, events = _tuner(finetune_bundle, tmp_path, shadow_max_diff=1.0)
    obs = np.array([0.3, -0.2, 0.5], np.float32)
    good_action = backend.act(obs).copy()
    _episodes(tuner, 0, -150.0)  # the bundle's weights earn -150
    negated = {k: -v for k, v in tuner.good_sets.actor.items()}
    _plant(tuner, negated)
    assert tuner.candidate is not None, events[-1]
    assert not np.allclose(backend.act(obs), good_action)  # the candidate is serving
    _episodes(tuner, tuner.candidate.generation, -900.0)
    assert tuner.counts["rollbacks"] == 1 and tuner.counts["promotions"] == 0
    np.testing.assert_allclose(backend.act(obs), good_action, atol=1e-6)  # swapped back
    assert tuner.verdicts == ["rollback"]  # type: ignore[attr-defined]  # the learner resets its actor
    assert not LastGoodStore(tmp_path / "ft").exists()  # nothing promoted, nothing written
    assert [e["event"] for e in events][-2:] == ["swap", "rollback"]


def test_promotion_saves_last_good_and_a_later_rollback_keeps_it(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, _, _ = _tuner(finetune_bundle, tmp_path, shadow_max_diff=1.0)
    _episodes(tuner, 0, -300.0)
    better = {k: v * 1.01 for k, v in tuner.good_sets.actor.items()}
    _plant(tuner, better)
    assert tuner.candidate is not None
    _episodes(tuner, tuner.candidate.generation, -200.0)
    store = LastGoodStore(tmp_path / "ft")
    assert tuner.counts["promotions"] == 1 and store.exists()
    sha = sha256_file(store.path)
    info = json.loads(store.info_path.read_text())
    assert info["sha256"] == sha and info["returns"] == [-200.0] * WINDOW
    saved = store.load()
    np.testing.assert_allclose(saved.actor()["actor.mu.weight"], better["actor.mu.weight"])
    assert saved.states.shape[1] == 3 and saved.info["sidecar"] == "ok"
    assert {k: v.shape for k, v in saved.tensors.items()} == {k: v.shape for k, v in tuner.good_state.items()}
    _plant(tuner, {k: -v for k, v in better.items()})
    assert tuner.candidate is not None
    _episodes(tuner, tuner.candidate.generation, -2000.0)
    assert tuner.counts["rollbacks"] == 1
    assert sha256_file(store.path) == sha  # the last good weights on disk are untouched
    assert tuner.verdicts == ["promote", "rollback"]  # type: ignore[attr-defined]


def test_learner_rejection_is_counted_and_nothing_swaps(finetune_bundle: Path, tmp_path: Path) -> None:
    tuner, backend, events = _tuner(finetune_bundle, tmp_path)
    swaps = backend.swaps
    message = {"kind": "event", "counter": "shadow_rejections", "reason": "shadow check: too far", "collected": 50}
    tuner._on_message(message)
    assert tuner.candidate is None and tuner.counts["shadow_rejections"] == tuner.counts["candidates"] == 1
    assert backend.swaps == swaps and events[-1]["event"] == "reject" and events[-1]["step"] == 50


def test_shadow_check_and_judge_rules() -> None:
    good = np.zeros((4, 1))
    assert shadow_check(good + 0.1, good, [-2.0], [2.0], 0.05).ok
    assert not shadow_check(good + 1.0, good, [-2.0], [2.0], 0.05).ok
    assert "non-finite" in shadow_check(good * np.nan, good, [-2.0], [2.0], 0.5).reason
    assert "bounds" in shadow_check(good + 3.0, good, [-2.0], [2.0], 1.0).reason
    assert judge([-400.0], [-300.0], 0.25).regressed  # dropped 100 > 75
    assert not judge([-350.0], [-300.0], 0.25).regressed
    assert judge([0.5], [10.0], 0.5).regressed and not judge([9.0], [10.0], 0.5).regressed
    # noise: a 100-point drop between windows that spread by ~150 is not a regression at 2 standard errors...
    good, noisy = [-300.0, -100.0, -450.0, -150.0], [-400.0, -200.0, -550.0, -250.0]
    verdict = judge(noisy, good, 0.25, noise_z=2.0)
    assert not verdict.regressed and verdict.allowed_drop == pytest.approx(2 * verdict.noise_se)
    assert judge(noisy, good, 0.25).regressed  # ...though it is beyond the threshold alone
    # ...while a real regression clears both bars, and identical returns leave the threshold in charge
    assert judge([-900.0, -950.0, -850.0, -1000.0], good, 0.25, noise_z=2.0).regressed
    assert judge([-400.0] * 3, [-300.0] * 3, 0.25, noise_z=2.0).regressed


def test_only_episodes_served_by_one_generation_are_judged() -> None:
    log = EpisodeLog()
    for t in range(10):
        log.step(-1.0, t == 9)
    log.step(-1.0, False)
    log.generation = 1  # a swap in the middle of the second episode
    for t in range(9):
        log.step(-1.0, t == 8)
    log.step(-2.0, True)
    assert [(r.generation, r.whole, r.steps) for r in log.finished] == [(0, True, 10), (0, False, 10), (1, True, 1)]


def test_missing_last_good_is_a_one_line_error(tmp_path: Path) -> None:
    from sac_edge.common.errors import SacEdgeError

    with pytest.raises(SacEdgeError, match="no last good weights"):
        LastGoodStore(tmp_path).load()
