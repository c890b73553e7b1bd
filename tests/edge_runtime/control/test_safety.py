"""The action guard: finite, in-bounds actions always; the last safe one held for a non-finite action."""

from __future__ import annotations

import numpy as np

from sac_edge.edge_runtime.control.safety import ActionGuard


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
