"""Values a library caller hands ``Runtime`` that no control loop can use: done flags that are not one bool
(an array from a vectorised env, the string ``"False"``, which ``bool`` calls true, None) raised numpy's or
Python's own exceptions from ``observe`` or were silently taken as true, and observation bounds with a low
above its high were accepted (every observation then "repaired"). Each is one ``SacEdgeError`` line now; the
bounds before any backend is opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime import compose
from sac_edge.edge_runtime.config import RuntimeOptions
from sac_edge.edge_runtime.runtime import Runtime

OBS = np.array([1.0, 0.0, 0.5], np.float32)


def _runtime(bundle: Path, **bounds: Any) -> Runtime:
    return Runtime(RuntimeOptions.of(str(bundle), backend="onnxruntime"), **bounds)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        (np.array([True, False]), "terminated must be one bool, got an array of shape (2,)"),
        ("False", "terminated must be a bool (True or False), got 'False'"),
        (None, "terminated must be a bool (True or False), got None"),
        (0.5, "terminated must be a bool (True or False), got 0.5"),
        (2, "terminated must be a bool (True or False), got 2"),
    ],
)
def test_a_bad_done_flag_is_one_line(bundle: Path, flag: object, message: str) -> None:
    with _runtime(bundle) as runtime:
        action = runtime.act(OBS)
        with pytest.raises(SacEdgeError) as raised:
            runtime.observe(OBS, action, -1.0, OBS, flag, False)  # type: ignore[arg-type]
        assert str(raised.value) == message
        runtime.observe(OBS, action, -1.0, OBS, np.bool_(True), np.array([0]))  # what a gymnasium env returns
        assert runtime.summary().episodes == 1 and runtime.summary().transitions == 1


def test_inverted_observation_bounds_are_refused_before_any_backend(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_backends(*args: object, **kwargs: object) -> None:
        raise AssertionError("a backend was opened before the bounds were checked")

    monkeypatch.setattr(compose, "open_backends", no_backends)
    runtime = _runtime(bundle, obs_low=[-1, -1, 8], obs_high=[1, 1, -8])
    with pytest.raises(
        SacEdgeError, match=r"obs_low\[2\] = 8 is above obs_high\[2\] = -8 .*are the two bounds swapped"
    ):
        runtime.open()
