"""onnxruntime's swaps (``--finetune``): the in-place refill (CPU fp32) and the rebuild from the
pre-optimised graph (CPU int8) answer like a fresh session from the file, and the retired in-place
generation is never written while an ``act`` may still be reading it."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.backends.base import BackendOptions, SwapPath
from sac_edge.edge_runtime.backends.onnxrt.runner import RELEASE_TIMEOUT_S, OrtBackend
from sac_edge.edge_runtime.backends.registry import open_backend

FOR_SWAPS = BackendOptions(refit=True)


def _actor_sets(bundle_path: Path, n: int) -> list[dict[str, np.ndarray]]:
    """``n`` actor weight sets that act differently in every layer (the deterministic graph's tensors)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(bundle_path / "learner.safetensors"))
    actor = {k: v for k, v in tensors.items() if k.startswith("actor.") and not k.startswith("actor.log_std")}
    rng = np.random.default_rng(0)
    return [
        {k: (v * rng.uniform(-2.0, 2.0) + rng.normal(0, 0.05, v.shape)).astype(np.float32) for k, v in actor.items()}
        for _ in range(n)
    ]


def _fresh(model: Path, weights: dict[str, np.ndarray]) -> ort.InferenceSession:
    """A new default session (prepacking on) with ``weights`` as its initializers."""
    so = ort.SessionOptions()
    values = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for v in weights.values()]
    for name, value in zip(weights, values):
        so.add_initializer(name, value)
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    session.keep_alive = values  # type: ignore[attr-defined]
    return session


def _in_place(bundle_path: Path) -> OrtBackend:
    backend = open_backend(open_bundle(bundle_path), "onnxruntime", "fp32", FOR_SWAPS)
    assert isinstance(backend, OrtBackend) and backend.describe()["swap"] == "in place"
    return backend


def test_in_place_swap_answers_like_a_fresh_session(pendulum_bundle: Path) -> None:
    backend = _in_place(pendulum_bundle)
    obs = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32) * 2
    for weights in _actor_sets(pendulum_bundle, 4):
        report = backend.swap_weights(weights)
        assert report.applied == len(weights)
        want = _fresh(backend.model, weights).run(["action"], {"obs": obs})[0]
        np.testing.assert_allclose(np.stack([backend.act(o).copy() for o in obs]), want, atol=1e-5)
        np.testing.assert_allclose(backend.act_batch(obs), want, atol=1e-5)
    assert backend.swaps == 4


def test_only_fp32_on_the_cpu_for_swaps_is_refilled(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    assert open_backend(bundle, "onnxruntime", "fp32").describe()["swap"] == "rebuild"  # no --finetune
    int8 = open_backend(bundle, "onnxruntime", "int8", FOR_SWAPS)  # slower unpacked: rebuilt
    assert int8.describe()["swap"].startswith("rebuild")  # pre-optimised where the start-up check allows


def test_the_retired_generation_waits_for_the_act_that_may_hold_it(pendulum_bundle: Path) -> None:
    backend = _in_place(pendulum_bundle)
    a, b = _actor_sets(pendulum_bundle, 2)
    obs = np.array([0.3, -0.2, 1.5], np.float32)
    serving = backend.serving
    backend.entered += 1  # the control thread is inside act on the serving generation...
    backend.swap_weights(a)  # ...when a swap retires it (the spare generation was free: it is refilled)
    assert backend.retired is serving
    before = {k: v.copy() for k, v in serving.arrays.items()}
    swap = threading.Thread(target=backend.swap_weights, args=(b,))
    swap.start()
    swap.join(RELEASE_TIMEOUT_S / 5)
    assert swap.is_alive()  # waiting for that act to return
    for name, value in before.items():
        np.testing.assert_array_equal(serving.arrays[name], value)
    backend.left += 1  # it returns
    swap.join()
    assert backend.serving is serving  # refilled and serving again
    want = _fresh(backend.model, b).run(["action"], {"obs": obs[None]})[0][0]
    np.testing.assert_allclose(backend.act(obs), want, atol=1e-5)


def test_an_act_that_never_returns_gets_a_fresh_generation_instead(pendulum_bundle: Path) -> None:
    backend = _in_place(pendulum_bundle)
    a, b = _actor_sets(pendulum_bundle, 2)
    obs = np.array([0.3, -0.2, 1.5], np.float32)
    serving = backend.serving
    backend.entered += 1  # an act on the serving generation that does not return
    backend.swap_weights(a)
    before = {k: v.copy() for k, v in serving.arrays.items()}
    report = backend.swap_weights(b)
    assert report.seconds >= RELEASE_TIMEOUT_S and backend.serving is not serving
    for name, value in before.items():  # never written
        np.testing.assert_array_equal(serving.arrays[name], value)
    want = _fresh(backend.model, b).run(["action"], {"obs": obs[None]})[0][0]
    np.testing.assert_allclose(backend.act(obs), want, atol=1e-5)


def test_swaps_into_the_test_int8_graph_from_the_pre_optimised_graph_match_the_file(pendulum_bundle: Path) -> None:
    """The device suite's int8 graph (onnxruntime's static quantisation: int8 weights, int32 biases)."""
    backend = open_backend(open_bundle(pendulum_bundle), "onnxruntime", "int8", FOR_SWAPS)
    assert isinstance(backend, OrtBackend) and backend.describe()["swap"] == "rebuild (pre-optimised)"
    obs = np.random.default_rng(1).standard_normal((16, 3)).astype(np.float32) * 2
    before = backend.act_batch(obs)
    layers = {k: v for k, v in backend.swappable().items() if k.startswith("actor.") and k.endswith("_quantized")}
    assert len(layers) == 6  # three weights, three biases
    rng = np.random.default_rng(2)
    for _ in range(2):  # new integer weights and biases under the same (symmetric) scales
        weights = {k: rng.permutation(v.ravel()).reshape(v.shape) for k, v in layers.items()}
        backend.swap_weights(weights)
        want = _fresh(backend.model, weights).run(["action"], {"obs": obs})[0]
        np.testing.assert_array_equal(backend.act_batch(obs), want)
        assert not np.allclose(want, before, atol=1e-3)


@pytest.mark.torch  # finetune_bundle is built with torch
def test_int8_swaps_from_the_pre_optimised_graph_answer_like_the_file(finetune_bundle: Path) -> None:
    from sac_edge.edge_runtime.finetune.weight_swap import Int8Requantizer

    bundle = open_bundle(finetune_bundle)
    backend = open_backend(bundle, "onnxruntime", "int8", FOR_SWAPS)
    assert isinstance(backend, OrtBackend) and backend.swap_strategy.path is SwapPath.PRE_OPTIMISED
    assert backend.model.name == "policy.int8-cpu.onnx"
    requantizer = Int8Requantizer(bundle)
    obs = np.random.default_rng(1).standard_normal((16, bundle.spec.obs_dim)).astype(np.float32)
    before = backend.act_batch(obs)
    for weights in _actor_sets(finetune_bundle, 3):
        sets = requantizer.requantize(weights, None).initializers
        backend.swap_weights(sets)
        want = _fresh(backend.model, sets).run(["action"], {"obs": obs})[0]
        np.testing.assert_array_equal(backend.act_batch(obs), want)
        np.testing.assert_array_equal(np.stack([backend.act(o).copy() for o in obs]), want)
        assert not np.allclose(want, before, atol=1e-3)  # the swap changed the actions


@pytest.mark.torch
def test_a_pre_optimised_graph_that_drops_a_swapped_tensor_is_not_used(
    finetune_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the optimiser folded a weight the swap must replace, builds from its graph would keep the old
    value: the start-up check sees a different action and swaps rebuild from the file instead."""
    real = OrtBackend._save_optimised

    def drops_a_weight(self: OrtBackend) -> object:
        pre = real(self)
        assert pre is not None
        return pre._replace(names=pre.names - {next(n for n in pre.names if n.endswith("_quantized"))})

    monkeypatch.setattr(OrtBackend, "_save_optimised", drops_a_weight)
    backend = open_backend(open_bundle(finetune_bundle), "onnxruntime", "int8", FOR_SWAPS)
    assert isinstance(backend, OrtBackend) and backend.swap_strategy.path is SwapPath.FROM_FILE
    assert backend.describe()["swap"] == "rebuild"
    with pytest.raises(SacEdgeError, match=r"'rebuild \(pre-optimised\)' does not work .*start-up check failed"):
        open_backend(
            open_bundle(finetune_bundle), "onnxruntime", "int8", BackendOptions(swap=SwapPath.PRE_OPTIMISED)
        )  # asked for by name, it is refused rather than replaced


@pytest.mark.parametrize("path", [SwapPath.FROM_FILE, SwapPath.PRE_OPTIMISED, SwapPath.IN_PLACE])
def test_a_swap_strategy_selected_by_name_is_the_one_used_and_answers_like_the_file(
    pendulum_bundle: Path, path: SwapPath
) -> None:
    """What the benchmarks do to price one strategy against another: each, asked for without --finetune's
    refit, is used and installs weights that act like a fresh session with them."""
    backend = open_backend(open_bundle(pendulum_bundle), "onnxruntime", "fp32", BackendOptions(swap=path))
    assert isinstance(backend, OrtBackend) and backend.swap_strategy.path is path
    assert backend.describe()["swap"] == path.value and backend.in_place == (path is SwapPath.IN_PLACE)
    obs = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    for weights in _actor_sets(pendulum_bundle, 2):
        backend.swap_weights(weights)
        want = _fresh(backend.model, weights).run(["action"], {"obs": obs})[0]
        np.testing.assert_allclose(backend.act_batch(obs), want, atol=1e-5)
