"""The shield: envelope and stuck-sensor fallbacks within their windows, the ramp, the slew limit, the swap
ramp, and never a non-finite or out-of-bounds action."""

from __future__ import annotations

import numpy as np
import pytest

from sac_edge.common.envelope import Envelope
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard
from sac_edge.edge_runtime.control.shield import BlendRamp, Shield, ShieldOptions, SlewLimiter, StuckSensorDetector

LOW, HIGH = [-2.0, -1.0], [2.0, 1.0]


def unit_envelope(dim: int = 3, slew: list[float] | None = None) -> Envelope:
    """States inside [-1, 1] per dimension; a Mahalanobis threshold of 9 (three standard deviations)."""
    return Envelope(
        low=np.full(dim, -1.0),
        high=np.full(dim, 1.0),
        mean=np.zeros(dim),
        scale=np.full(dim, 0.5),
        whiten=np.eye(dim),
        threshold=9.0,
        slew=None if slew is None else np.array(slew),
        safe_action=np.zeros(2),
        facts={},
    )


def shield(**settings: object) -> Shield:
    events: list[dict[str, object]] = []
    made = Shield(ShieldOptions(**settings), LOW, HIGH, unit_envelope(), events.append)  # type: ignore[arg-type]
    made.events = events  # type: ignore[attr-defined]
    return made


def good(t: int) -> np.ndarray:
    return np.array([0.1 * np.sin(t), 0.2, -0.1 + 0.01 * t % 0.05], np.float32)


def test_ramp_blends_in_from_the_safe_action() -> None:
    s = shield(ramp_steps=4)
    policy = np.array([2.0, -1.0], np.float32)
    sent = [s.step(good(t), policy, True).copy() for t in range(6)]
    np.testing.assert_allclose(sent[0], [0.5, -0.25])  # a quarter of the way at the first step
    np.testing.assert_allclose(sent[3], policy)
    np.testing.assert_allclose(sent[5], policy)
    assert s.counts.fallbacks == 0


def test_a_restart_ramps_from_the_plants_own_action_clipped_and_finite() -> None:
    """``restart(origin)``: the ramp (and the slew limit, and a ``hold`` fallback) start where the plant is,
    not at the safe action; a value outside the bounds is clipped, a non-finite one is the safe action's."""
    s = shield(ramp_steps=4, slew=(0.6, 0.3))
    policy = np.array([-2.0, 1.0], np.float32)
    s.restart([1.6, float("nan")])
    first = s.step(good(0), policy, True).copy()
    # a quarter of the way from the origin (0.7, 0.25), the first slew-limited to 0.6 from the origin too
    np.testing.assert_allclose(first, [1.0, 0.25])
    s.restart([9.0, -0.2])
    np.testing.assert_allclose(s.step(good(1), policy, False), [2.0, -0.2])  # not inferred: the origin, held
    assert s.counts.fallbacks == 1 and s.counts.slew_limited == 1


@pytest.mark.parametrize("window", [1, 3])
def test_nan_burst_falls_back_after_the_window_and_comes_back_through_the_ramp(window: int) -> None:
    s = shield(shield_window=window, ramp_steps=2)
    policy = np.array([1.0, 0.5], np.float32)
    for t in range(5):
        s.step(good(t), policy, True)
    before = s.step(good(5), policy, True).copy()
    onset = s.steps + 1
    for t in range(6):
        obs = good(t)
        obs[1] = np.nan
        out = s.step(obs, np.array([-2.0, -1.0], np.float32), True)  # the guard's repair, say
        assert np.isfinite(out).all()
        if s.steps < onset + window - 1:
            assert not s.falling_back
        else:
            assert s.falling_back
            np.testing.assert_array_equal(out, before)  # hold: the last action sent
    assert s.counts.first_fallback_step == onset + window - 1  # the step the window filled
    assert s.counts.causes["envelope"] == 1 and s.events[0]["cause"] == "envelope"  # type: ignore[attr-defined]
    for t in range(window):
        s.step(good(t), policy, True)
    assert not s.falling_back and s.counts.ramps == 1
    assert s.events[-1]["event"] == "resume"  # type: ignore[attr-defined]


def test_a_stuck_sensor_falls_back_at_the_kth_identical_observation() -> None:
    s = shield(stuck_steps=4, shield_window=3, fallback="fixed", safe_action=(0.5, 0.0))
    policy = np.array([1.0, 1.0], np.float32)
    frozen = good(1)
    for k in range(1, 5):
        out = s.step(frozen.copy(), policy, True)
        assert s.falling_back == (k == 4)
    assert s.counts.causes["stuck"] == 1
    np.testing.assert_array_equal(out, np.float32([0.5, 0.0]))  # the fixed safe action


def test_an_action_not_inferred_falls_back_on_that_step() -> None:
    s = shield(ramp_steps=0)
    s.step(good(0), np.array([1.0, 0.0], np.float32), True)
    out = s.step(good(1), np.array([0.3, 0.3], np.float32), False)
    assert s.falling_back and s.counts.causes["not_inferred"] == 1
    np.testing.assert_array_equal(out, np.float32([1.0, 0.0]))


def test_slew_limit_and_swap_ramp() -> None:
    s = Shield(ShieldOptions(ramp_steps=2, slew=(0.5,)), LOW, HIGH, unit_envelope())
    a, b = np.array([2.0, 1.0], np.float32), np.array([-2.0, -1.0], np.float32)
    sent = [s.step(good(t), a, True).copy() for t in range(8)]
    assert np.abs(np.diff(np.array([[0.0, 0.0], *sent]), axis=0)).max() <= 0.5 + 1e-6
    np.testing.assert_allclose(sent[-1], a)
    s.weights_swapped()
    after = [s.step(good(t), b, True).copy() for t in range(12)]
    assert s.counts.swap_ramps == 1 and s.counts.slew_limited > 0
    assert np.abs(np.diff(np.array([sent[-1], *after]), axis=0)).max() <= 0.5 + 1e-6
    np.testing.assert_allclose(after[-1], b)


def test_the_envelope_check_rejects_what_lies_outside() -> None:
    s = shield()
    assert s.inside(np.zeros(3, np.float32)) and s.inside(np.array([0.9, 0.0, 0.0]))
    assert not s.inside(np.array([1.1, 0.0, 0.0]))  # outside one dimension's bounds
    assert not s.inside(np.array([0.9, 0.9, 0.9]))  # inside each bound, but a score of 3 * 1.8^2 > 9
    for bad in (np.array([np.nan, 0, 0]), np.array([np.inf, 0, 0]), np.zeros(4), np.array(["a", "b", "c"]), None):
        assert not s.inside(bad)


def test_the_per_step_check_agrees_with_the_envelope_on_every_kind_of_state() -> None:
    """The shield's one-product check against ``Envelope.inside`` (the export's own, per dimension): states
    on and within rounding of every bound, far-off centres, a dimension whose bounds are one point, NaN and
    infinities in each position, and ordinary states in and out of the score's threshold."""
    rng = np.random.default_rng(3)
    dim = 6
    low = np.array([-1.0, 1e6, -3e-3, 5.0, -2.0, 0.0])
    high = np.array([1.0, 1e6 + 2e-3, 7e-3, 5.0, 2.0, 1e-9])  # dim 3 never moved in training
    cov = np.cov(rng.normal(size=(dim, 500)))
    envelope = Envelope(
        low=low,
        high=high,
        mean=(low + high) / 2,
        scale=np.maximum(high - low, 1e-3) / 4,
        whiten=np.linalg.inv(np.linalg.cholesky(cov)),
        threshold=40.0,
        slew=None,
        safe_action=np.zeros(2),
        facts={},
    )
    s = Shield(ShieldOptions(), LOW, HIGH, envelope)
    states = [low + (high - low) * rng.uniform(-0.1, 1.1, size=dim) for _ in range(3000)]
    for i in range(dim):
        for edge in (low[i], high[i]):
            for nudge in (0.0, 1.0, -1.0):
                x = (low + high) / 2
                x[i] = np.nextafter(edge, edge + nudge) if nudge else edge
                states.append(x)
        for bad in (np.nan, np.inf, -np.inf):
            x = (low + high) / 2
            x[i] = bad
            states.append(x)
    expected = envelope.inside(np.array(states))
    got = np.array([s.inside(x) for x in states])
    assert expected.any() and not expected.all()
    assert (got == expected).all(), np.array(states)[got != expected][:3]


def test_random_faults_never_give_a_non_finite_or_out_of_bounds_action() -> None:
    rng = np.random.default_rng(0)
    s = Shield(ShieldOptions(shield_window=2, stuck_steps=3, ramp_steps=5, slew=(0.3, 0.1)), LOW, HIGH, unit_envelope())
    for _ in range(2000):
        obs = rng.standard_normal(3).astype(np.float32) * rng.choice([0.1, 10.0])
        if rng.random() < 0.1:
            obs[rng.integers(3)] = rng.choice([np.nan, np.inf, -np.inf])
        action = rng.uniform(LOW, HIGH).astype(np.float32)
        out = s.step(obs, action, bool(rng.random() < 0.95))
        assert np.isfinite(out).all() and np.all(out >= LOW) and np.all(out <= HIGH)
        if rng.random() < 0.01:
            s.restart()


def test_option_problems_name_the_flag() -> None:
    assert ShieldOptions().problem(2) is None
    assert "--shield-window" in str(ShieldOptions(shield_window=-1).problem())
    assert "--stuck-steps" in str(ShieldOptions(stuck_steps=1).problem())
    assert "--slew" in str(ShieldOptions(slew=(0.1, 0.2, 0.3)).problem(2))
    assert "--safe-action" in str(ShieldOptions(safe_action=(0.0,)).problem(2))
    assert "--ramp-steps" in str(ShieldOptions(ramp_steps=-1).problem())


@pytest.mark.parametrize("policy", ["clip", "hold"])
def test_the_runtime_path_on_the_guards_floats_matches_the_step_on_arrays(policy: str) -> None:
    """``filter_action`` on what the guards hand on (the observation guard testing the envelope's bounds in its
    own pass, the action guard's ``take``: what ``Runtime.act`` runs) against ``step`` on the guarded
    arrays: the same actions, counts and events on a stream of every fault and of states inside every bound
    whose score lies either side of the threshold, with declared bounds that cut into the envelope's on one
    dimension (the guard's second pass) and lie outside it on the others."""
    rng = np.random.default_rng(5)
    declared = (np.array([-5.0, -5.0, -5.0]), np.array([0.95, 5.0, 5.0]))
    settings = ShieldOptions(shield_window=2, stuck_steps=3, ramp_steps=4, slew=(0.3, 0.2))
    events: tuple[list[dict[str, object]], list[dict[str, object]]] = ([], [])
    arrays, floats = (Shield(settings, LOW, HIGH, unit_envelope(), e.append) for e in events)
    obs_guards = (ObservationGuard(*declared, policy), ObservationGuard(*declared, policy, floats.obs_bounds))
    act_guards = (ActionGuard(np.array(LOW), np.array(HIGH)), ActionGuard(np.array(LOW), np.array(HIGH)))
    last = np.zeros(3, np.float32)
    for t in range(3000):
        kind = rng.random()
        if kind < 0.1:
            obs = last.copy()  # stuck
        elif kind < 0.25:  # near a corner: inside every bound, the score on either side of the threshold
            obs = rng.choice([-1.0, 1.0], 3) * rng.uniform(0.8, 0.95, 3)
        else:
            obs = (rng.standard_normal(3) * rng.choice([0.2, 0.5, 3.0])).astype(rng.choice([np.float32, np.float64]))
            if kind < 0.3:
                obs[rng.integers(3)] = rng.choice([np.nan, np.inf, -np.inf])
        last = obs.astype(np.float32)
        raw = (rng.uniform(-3, 3, 2) if rng.random() < 0.9 else np.array([np.nan, 0.0])).astype(np.float32)
        inferred = rng.random() < 0.95
        if rng.random() < 0.01:
            arrays.weights_swapped(), floats.weights_swapped()
        if obs_guards[0].check(obs)[1] is None or not inferred:
            expected = arrays.step(obs, act_guards[0].hold(), False)
        else:
            expected = arrays.step(obs, act_guards[0].apply(raw), True)
        observed, safe, inside = obs_guards[1].check(obs)
        if safe is None or not inferred:
            got = floats.filter_action(observed, False, act_guards[1].safe, False)
        else:
            got = floats.filter_action(observed, inside, act_guards[1].take(raw), True)
        assert got.tolist() == expected.tolist(), t
    assert floats.summary() == arrays.summary() and events[0] == events[1]
    assert arrays.summary()["fallbacks"] > 10 and arrays.summary()["swap_ramps"] > 0
    assert arrays.summary()["out_of_envelope"] > obs_guards[1].nonfinite + obs_guards[1].out_of_range
    counts = [(g.nonfinite, g.out_of_range, g.malformed) for g in obs_guards]
    assert counts[0] == counts[1] and min(counts[0][:2]) > 0
    assert (act_guards[0].nonfinite, act_guards[0].clipped) == (act_guards[1].nonfinite, act_guards[1].clipped)


def test_the_stuck_sensor_detector_flags_the_kth_identical_observation_and_resets() -> None:
    stuck = StuckSensorDetector(3)
    same = np.array([0.1, 0.2], np.float32)
    assert [stuck.update(same) for _ in range(4)] == [False, False, True, True]
    assert not stuck.update(np.array([0.1, 0.25], np.float32))  # a change starts a new run
    assert not stuck.update(None) and not stuck.update(None)  # a malformed reading repeats nothing
    stuck.update(same), stuck.update(same)
    stuck.reset()
    assert not stuck.update(same) and not stuck.update(same) and stuck.update(same)
    assert stuck.update(same.astype(np.float64)) is False  # other bytes: not the same reading


def test_the_blend_ramp_goes_linearly_from_its_origin_and_stays_in_bounds() -> None:
    ramp = BlendRamp(4, [(-1.0, 1.0), (-1.0, 1.0)])
    assert ramp.start([0.0, -1.0]) and ramp.left == 4
    steps = [ramp.apply([1.0, 1.0]) for _ in range(4)]
    assert steps == [[0.25, -0.5], [0.5, 0.0], [0.75, 0.5], [1.0, 1.0]] and ramp.left == 0
    assert ramp.start([0.0, 0.0]) and ramp.apply([2.0, 0.0]) == [0.5, 0.0]  # clipped to the bounds
    ramp.stop()
    assert ramp.left == 0
    off = BlendRamp(0, [(-1.0, 1.0)])
    assert not off.start([0.5]) and off.left == 0


def test_the_slew_limiter_limits_each_dimension_and_copies_only_when_it_limits() -> None:
    slew = SlewLimiter([0.1, 0.0])  # 0: no limit on the second dimension
    action = [0.05, 5.0]
    assert slew.limit(action, [0.0, 0.0]) is action and slew.active
    limited = slew.limit([0.5, -5.0], [0.0, 0.0])
    assert limited == [0.1, -5.0]
    assert slew.limit([-0.5, 0.0], [0.0, 0.0]) == [-0.1, 0.0]
    off = SlewLimiter([0.0, 0.0])
    big = [9.0, -9.0]
    assert not off.active and off.limit(big, [0.0, 0.0]) is big
