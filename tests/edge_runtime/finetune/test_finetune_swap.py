"""Weight swaps through the fine-tuner's path never serve a half-written weight set, int8 included."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from sac_edge.common.bundle import open_bundle
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.finetune.weight_swap import Int8Requantizer, WeightSwapper


def _actor(bundle: Path) -> dict[str, np.ndarray]:
    return {k: v for k, v in load_file(str(bundle / "learner.safetensors")).items() if k.startswith("actor.")}


def _other(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A second weight set that gives different actions in every layer."""
    rng = np.random.default_rng(1)
    return {k: (v * -1.5 + rng.normal(0, 0.05, v.shape)).astype(np.float32) for k, v in weights.items()}


@pytest.mark.parametrize(
    ("backend", "precision"), [("onnxruntime", "fp32"), ("torch", "fp32"), ("onnxruntime", "int8")]
)
def test_concurrent_reader_sees_whole_sets(finetune_bundle: Path, backend: str, precision: str) -> None:
    bundle = open_bundle(finetune_bundle)
    served = open_backend(bundle, backend, precision)
    if precision == "int8":  # onnxruntime's CPU provider serves the integer graph: int8 / int32 tensors swap
        assert served.describe()["file"] == "policy.int8-cpu.onnx"
    swapper = WeightSwapper({precision: served}, bundle)
    a = _actor(finetune_bundle)
    b = _other(a)
    rng = np.random.default_rng(0)
    obs = rng.normal(0, 1, (8, bundle.spec.obs_dim)).astype(np.float32)
    expected = []
    for weights in (a, b):
        swapper.install(swapper.prepare(weights, None))
        expected.append(np.stack([served.act(o).copy() for o in obs]))
    assert np.abs(expected[0] - expected[1]).min() > 1e-3  # each layer matters: a mixed set would show
    bad: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        i = 0
        while not stop.is_set():
            k = i % len(obs)
            got = served.act(obs[k])
            if not any(np.allclose(got, e[k], atol=1e-6) for e in expected):
                bad.append(f"{got} is neither {expected[0][k]} nor {expected[1][k]}")
            i += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        sets = [swapper.prepare(w, None) for w in (b, a)]
        for i in range(30):
            swapper.install(sets[i % 2])
    finally:
        stop.set()
        thread.join()
    assert not bad, bad[:3]
    assert served.swaps >= 32


def test_int8_requantisation_recomputes_weight_scales(finetune_bundle: Path) -> None:
    bundle = open_bundle(finetune_bundle)
    req = Int8Requantizer(bundle)
    a = _actor(finetune_bundle)
    states = np.random.default_rng(0).normal(0, 1, (64, bundle.spec.obs_dim)).astype(np.float32)
    same = req.requantize(a, states)
    scaled = req.requantize({k: v * 2 for k, v in a.items()}, states)
    scale_names = [k for k in same.initializers if k.endswith("_w0_scale")]
    assert scale_names
    for name in scale_names:  # per-channel weight scales follow the new weights (2x)
        np.testing.assert_allclose(scaled.initializers[name], 2 * same.initializers[name], rtol=1e-6)
    assert same.passed and same.mean_error_frac <= 0.01


def test_int8_candidate_failing_the_gate_is_installed_nowhere(finetune_bundle: Path) -> None:
    bundle = open_bundle(finetune_bundle)
    fp32, int8 = open_backend(bundle, "onnxruntime", "fp32"), open_backend(bundle, "onnxruntime", "int8")
    swapper = WeightSwapper({"fp32": fp32, "int8": int8}, bundle)
    a = _actor(finetune_bundle)
    # hidden activations far outside the bundle's calibrated ranges: int8 clips them, so actions diverge
    huge = {k: (v * 40 if k.endswith("trunk.0.weight") else v) for k, v in a.items()}
    states = np.random.default_rng(0).normal(0, 1, (128, bundle.spec.obs_dim)).astype(np.float32)
    before = fp32.swaps, int8.swaps
    outcome = swapper.install(swapper.prepare(huge, states))
    assert not outcome.live and outcome.int8 is not None and not outcome.int8["passed"]
    assert (fp32.swaps, int8.swaps) == before


def test_warm_up_keeps_serving_the_same_weights(finetune_bundle: Path) -> None:
    bundle = open_bundle(finetune_bundle)
    fp32, int8 = open_backend(bundle, "onnxruntime", "fp32"), open_backend(bundle, "onnxruntime", "int8")
    swapper = WeightSwapper({"fp32": fp32, "int8": int8}, bundle)
    a = _actor(finetune_bundle)
    sets = swapper.prepare(a, None)
    swapper.install(sets)
    obs = np.array([0.3, -0.2, 0.5], np.float32)
    before = fp32.act(obs).copy(), int8.act(obs).copy()
    swapper.warm_up(sets)  # a second generation of the same weights
    assert (fp32.swaps, int8.swaps) == (2, 2)
    np.testing.assert_allclose(fp32.act(obs), before[0], atol=1e-6)
    np.testing.assert_allclose(int8.act(obs), before[1], atol=1e-6)
