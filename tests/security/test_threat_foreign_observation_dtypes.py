"""An observation in any numeric dtype, or one that is not an array of numbers at all, never makes
``Runtime.act`` raise (issue 42, item 3).

A robot's driver hands over what its sensors give: ``np.longdouble`` from a filter, integers from an
encoder, float16 from a camera pipeline. The guard converts each to the policy's dtype once, so the
stages after it (the inference, the shield's envelope score) see one dtype; a malformed one is counted and
answered with a safe action, never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bundles import make_bundle
from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions

NUMERIC = (
    np.float16, np.float32, np.float64, np.longdouble,
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
)  # fmt: skip


@pytest.fixture(scope="module")
def enveloped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("dtypes") / "b", int8=None, envelope=True)


def _runtime(bundle: Path, **flags: object) -> Runtime:
    options = RuntimeOptions.of(str(bundle), backend="onnxruntime", **flags)
    return Runtime(options, obs_low=[-1, -1, -8], obs_high=[1, 1, 8])


def _fine(action: np.ndarray) -> bool:
    return action.shape == (1,) and bool(np.isfinite(action).all()) and -2.0 <= float(action[0]) <= 2.0


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda t: np.dtype(t).name)
def test_every_numeric_dtype_inside_the_envelope_gets_an_inferred_action(enveloped: Path, dtype: type) -> None:
    with _runtime(enveloped) as runtime:
        shield = runtime.shield
        assert shield is not None and shield.envelope is not None
        inside = shield.envelope.mean  # the training states' mean: inside the envelope
        obs = inside.astype(dtype) if np.dtype(dtype).kind == "f" else np.zeros(3, dtype)
        for _ in range(20):
            assert _fine(runtime.act(obs))
        summary = runtime.summary()
    assert summary.obs_malformed == 0 and summary.obs_held == 0, summary
    assert summary.backend_errors == 0 and summary.stopped_by is None


@pytest.mark.parametrize("policy", ["clip", "hold"])
@pytest.mark.parametrize("shield", ["on", "guards"])
def test_nothing_handed_to_act_makes_it_raise(enveloped: Path, policy: str, shield: str) -> None:
    class Exploding:
        def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
            raise RuntimeError("a driver's object that cannot become an array")

    hostile: list[object] = [
        None, "0.1,0.2,0.3", [0.1, 0.2, 0.3], (0.1, 0.2, 0.3), 3.0, Exploding(),
        np.zeros(3, np.complex128), np.zeros(3, bool), np.array(["a", "b", "c"]), np.array([0.1, None, 0.3]),
        np.zeros(3, [("x", "f4")]), np.zeros((3, 1)), np.zeros(4), np.float64(1.0), np.zeros((0,)),
        np.array([np.nan, np.inf, -np.inf], np.longdouble), np.full(3, np.finfo(np.longdouble).max),
        np.full(3, 10.0**300), np.array([2**64 - 1] * 3, np.uint64),
        np.ma.masked_array(np.zeros(3, np.longdouble), mask=[True, False, False]),
        np.zeros(6, np.longdouble)[::2],
    ]  # fmt: skip
    with _runtime(enveloped, obs_fault=policy, shield=shield) as runtime:
        for obs in hostile:
            assert _fine(runtime.act(obs)), obs  # type: ignore[arg-type]
        summary = runtime.summary()
    assert summary.steps == len(hostile) and summary.stopped_by is None
