"""The guards: observations checked and repaired per the policy, actions always finite and in bounds."""

from __future__ import annotations

import numpy as np
import pytest

from sac_edge.edge_runtime.control.safety import PYTHON_CHECK_MAX, ActionGuard, ObservationGuard


def handed_on(checked: tuple[object, object, bool], expected: tuple[object, object, bool]) -> bool:
    """Whether ``check`` handed on these very arrays (or None) and this ``inside``."""
    return checked[0] is expected[0] and checked[1] is expected[1] and checked[2] == expected[2]


def test_actions_are_clipped_counted_and_held() -> None:
    guard = ActionGuard(np.array([-1.0, 0.0, -2.0]), np.array([1.0, 0.5, 2.0]))
    out = guard.apply(np.array([0.5, 0.25, -1.5], np.float32))
    np.testing.assert_array_equal(out, [0.5, 0.25, -1.5])
    assert (guard.clipped, guard.nonfinite) == (0, 0)
    out = guard.apply(np.array([3.0, -1.0, 2.5], np.float64))
    np.testing.assert_array_equal(out, [1.0, 0.0, 2.0])
    assert out.dtype == np.float32 and guard.clipped == 1
    for bad in (np.nan, np.inf, -np.inf):
        out = guard.apply(np.array([0.0, bad, 0.0], np.float32))
        np.testing.assert_array_equal(out, [1.0, 0.0, 2.0])  # the last safe action
    assert guard.nonfinite == 3 and guard.clipped == 1
    np.testing.assert_array_equal(guard.apply(np.array([[0.1, 0.2, 0.3]], np.float32)), np.float32([0.1, 0.2, 0.3]))


@pytest.mark.parametrize("dims", [3, PYTHON_CHECK_MAX + 1])  # the Python-float path and the numpy one
def test_observations_are_checked_repaired_and_counted(dims: int) -> None:
    low, high = np.full(dims, -1.0), np.full(dims, 1.0)
    low[0], high[0] = -np.inf, np.inf  # an unbounded component still rejects inf and NaN
    guard = ObservationGuard(low, high, "clip")
    good = np.linspace(-0.5, 0.5, dims).astype(np.float32)
    assert handed_on(guard.check(good), (good, good, False))
    for bad, counter in ((np.inf, "nonfinite"), (np.nan, "nonfinite"), (2.0, "out_of_range")):
        obs = good.copy()
        obs[0 if bad != 2.0 else 1] = bad
        before = getattr(guard, counter)
        observed, repaired, inside = guard.check(obs)
        assert getattr(guard, counter) == before + 1
        assert observed is obs and not inside  # as read, for the shield's tests of the sensors
        assert repaired is not None and np.isfinite(repaired).all()
        assert np.all(repaired >= low) and np.all(repaired <= high)
        np.testing.assert_array_equal(repaired[2:], good[2:])
    assert (guard.nonfinite, guard.out_of_range, guard.malformed) == (2, 1, 0)
    observed, safe, _ = guard.check(np.zeros(dims + 1))
    assert observed is None and safe is not None and guard.malformed == 1
    assert not guard.well_formed(np.zeros(dims + 1)) and not guard.well_formed("obs")
    held = ObservationGuard(low, high, "hold")
    assert held.check(np.full(dims, np.nan))[1] is None and held.nonfinite == 1


def test_the_last_good_values_survive_an_env_that_reuses_its_array() -> None:
    guard = ObservationGuard(np.full(3, -1.0), np.full(3, 1.0), "clip")
    buffer = np.array([0.1, 0.2, 0.3])
    assert guard.check(buffer)[1] is buffer
    buffer[:] = [np.nan, 0.5, 0.5]  # the env wrote its next observation into the same array
    np.testing.assert_allclose(guard.check(buffer)[1], [0.1, 0.5, 0.5])


def test_inner_bounds_are_tested_in_the_same_pass_and_never_refuse_a_fine_observation() -> None:
    """``inner`` (the shield's envelope bounds): ``inside`` only for an observation inside both; one inside
    the declared bounds alone is still served unchanged and counted as nothing; an empty intersection
    (inner bounds outside the declared ones) serves every fine observation, never ``inside``."""
    low, high = np.array([-2.0, -2.0]), np.array([2.0, 2.0])
    guard = ObservationGuard(low, high, "hold", (np.array([-1.0, -3.0]), np.array([1.0, 1.5])))
    inside, outer_only, bad = np.array([0.5, 1.5]), np.array([1.5, 1.6]), np.array([2.5, 0.0])
    assert handed_on(guard.check(inside), (inside, inside, True))
    assert handed_on(guard.check(outer_only), (outer_only, outer_only, False))
    assert handed_on(guard.check(bad), (bad, None, False))
    assert handed_on(guard.check(inside), (inside, inside, True))
    assert (guard.out_of_range, guard.nonfinite, guard.malformed) == (1, 0, 0)
    apart = ObservationGuard(low, high, "clip", (np.array([5.0, 5.0]), np.array([6.0, 6.0])))
    assert handed_on(apart.check(inside), (inside, inside, False)) and apart.out_of_range == 0


def test_take_is_apply_without_the_write() -> None:
    guard = ActionGuard(np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
    assert guard.take(np.array([0.5, 3.0], np.float32)) == [0.5, 1.0] and guard.clipped == 1
    assert guard.take(np.array([np.nan, 0.0], np.float32)) == [0.5, 1.0] and guard.nonfinite == 1
    assert guard.safe == [0.5, 1.0] and guard.hold().tolist() == [0.5, 1.0]


@pytest.mark.parametrize("dims", [3, PYTHON_CHECK_MAX + 1])
@pytest.mark.parametrize(
    "dtype",
    [np.float16, np.float32, np.float64, np.longdouble, np.int8, np.int64, np.uint16, np.uint64, ">f8", "<f4"],
)
def test_every_real_dtype_is_converted_to_the_policys_once(dims: int, dtype: object) -> None:
    guard = ObservationGuard(np.full(dims, -100.0), np.full(dims, 100.0), "clip", dtype=np.float32)
    obs = np.arange(dims).astype(dtype) % 50
    observed, safe, _ = guard.check(obs)
    assert observed is safe and observed is not None and observed.dtype == np.float32
    np.testing.assert_array_equal(observed, obs.astype(np.float64))
    if np.dtype(dtype) == np.float32:
        assert observed is obs  # nothing to convert: the caller's array itself
    far = np.full(dims, np.finfo(np.longdouble).max)  # beyond float32: out of range, not an infinity
    observed, safe, _ = guard.check(far)
    assert observed is not None and observed.dtype == np.float32 and guard.out_of_range == 1
    assert safe is not None and safe.dtype == np.float32 and np.isfinite(safe).all()


def test_unbounded_observations_beyond_the_policys_dtype_are_out_of_range() -> None:
    guard = ObservationGuard(np.full(2, -np.inf), np.full(2, np.inf), "clip", dtype=np.float32)
    _, safe, _ = guard.check(np.array([1e300, 0.5]))
    assert safe is not None and np.isfinite(safe).all() and guard.out_of_range == 1
