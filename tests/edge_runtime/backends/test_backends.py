"""The Backend contract on the real onnxruntime and torch backends."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.backends.base import Backend, BackendOptions, check_weights
from sac_edge.edge_runtime.backends.registry import candidates, open_backend, refusal

# "for swaps": opened as --finetune opens it (onnxruntime's CPU fp32 session then swaps in place)
BACKENDS = ("onnxruntime", "onnxruntime for swaps", pytest.param("torch", marks=pytest.mark.torch))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, pendulum_bundle: Path) -> Backend:
    name = request.param.split()[0]
    return open_backend(open_bundle(pendulum_bundle), name, "fp32", BackendOptions(refit="swaps" in request.param))


@pytest.mark.torch
def test_ort_and_torch_agree(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    ort, torch_ = open_backend(bundle, "onnxruntime", "fp32"), open_backend(bundle, "torch", "fp32")
    obs = np.random.default_rng(0).standard_normal((16, 3)).astype(np.float32) * 3
    np.testing.assert_allclose(ort.act_batch(obs), torch_.act_batch(obs), atol=1e-5)
    for row in obs:
        np.testing.assert_allclose(ort.act(row), torch_.act(row), atol=1e-5)
    low, high = bundle.spec.action_low[0], bundle.spec.action_high[0]
    assert np.all(ort.act_batch(obs) >= low) and np.all(ort.act_batch(obs) <= high)


def test_act_reuses_its_output_buffer(backend: Backend) -> None:
    first = backend.act(np.array([1.0, 0.0, 0.5], np.float32))
    value = first.copy()
    second = backend.act(np.array([-1.0, 0.3, -4.0], np.float64))  # float64 input is cast in place
    assert second is first
    assert not np.allclose(second, value)
    assert second.shape == (1,) and second.dtype == np.float32


def _scaled(bundle_path: Path, factor: float) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors = load_file(str(bundle_path / "learner.safetensors"))
    return {k: v * factor for k, v in tensors.items() if k.startswith("actor.")}


def test_swap_weights_is_atomic_under_a_concurrent_reader(backend: Backend, pendulum_bundle: Path) -> None:
    obs = np.array([0.3, -0.2, 1.5], np.float32)
    weights_a = _scaled(pendulum_bundle, 1.0)
    weights_b = _scaled(pendulum_bundle, -0.7)
    expected_a = backend.act(obs).copy()
    backend.swap_weights(weights_b)
    expected_b = backend.act(obs).copy()
    backend.swap_weights(weights_a)
    assert not np.allclose(expected_a, expected_b, atol=1e-4)

    seen: list[np.ndarray] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            seen.append(backend.act(obs).copy())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(20):
            report = backend.swap_weights(weights_b if i % 2 == 0 else weights_a)
            assert report.applied >= 6 and report.seconds >= 0
    finally:
        stop.set()
        thread.join()
    outputs = np.array(seen)
    is_a = np.all(np.abs(outputs - expected_a) < 1e-6, axis=1)
    is_b = np.all(np.abs(outputs - expected_b) < 1e-6, axis=1)
    assert np.all(is_a | is_b), "a reader saw a mixed weight set"
    assert backend.swaps == 22


def test_swap_weights_rejects_a_wrong_shape_and_reports_unused_names(backend: Backend) -> None:
    with pytest.raises(SacEdgeError, match="shape"):
        backend.swap_weights({"actor.mu.weight": np.zeros((2, 2), np.float32)})
    report = backend.swap_weights({"actor.mu.bias": np.zeros(1, np.float32), "nonexistent": np.zeros(1)})
    assert report.applied == 1 and report.ignored == ("nonexistent",)


def test_check_weights_keeps_scalar_shapes() -> None:
    use, ignored = check_weights({"scale": np.float64(0.5), "w": [[1, 2]], "x": 1}, {"scale": (), "w": (1, 2)})
    assert use["scale"].shape == () and use["scale"].dtype == np.float32 and use["w"].flags.c_contiguous
    assert ignored == ("x",)
    with pytest.raises(SacEdgeError, match="shape"):
        check_weights({"scale": np.zeros(1)}, {"scale": ()})


def test_describe(backend: Backend) -> None:
    info = backend.describe()
    assert info["backend"] == backend.name and info["precision"] == "fp32" and "file" in info


def test_int8_runs_only_when_the_gate_accepted(pendulum_bundle: Path, rejected_bundle: Path) -> None:
    accepted = open_backend(open_bundle(pendulum_bundle), "onnxruntime", "int8")
    fp32 = open_backend(open_bundle(pendulum_bundle), "onnxruntime", "fp32")
    obs = np.random.default_rng(1).standard_normal((32, 3)).astype(np.float32)
    assert np.max(np.abs(accepted.act_batch(obs) - fp32.act_batch(obs))) < 0.2
    with pytest.raises(SacEdgeError, match="rejected by the bundle's accuracy gate"):
        open_backend(open_bundle(rejected_bundle), "onnxruntime", "int8")


@pytest.mark.torch
def test_refusals_name_the_reason(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    assert "not in the bundle" in str(refusal(bundle, "onnxruntime", "fp16"))
    assert "runs fp32 only" not in str(refusal(bundle, "torch", "int8"))
    reason = refusal(bundle, "tensorrt", "fp32")
    assert reason is None or "tensorrt" in reason
    with pytest.raises(SacEdgeError, match="unknown backend"):
        refusal(bundle, "tflite", "fp32")
    usable = {(c.backend, c.precision) for c in candidates(bundle) if c.refusal is None}
    assert {("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("torch", "fp32")} <= usable


def test_a_graph_newer_than_onnxruntime_names_both_versions_and_the_fix(pendulum_bundle: Path, tmp_path: Path) -> None:
    import shutil

    import onnx

    from sac_edge.common.manifest import file_entry, read_manifest, write_manifest

    bundle = tmp_path / "future"
    shutil.copytree(pendulum_bundle, bundle)
    model = onnx.load(str(bundle / "policy.onnx"))
    model.opset_import[0].version = 99  # as a future sac-export might stamp it
    onnx.save(model, str(bundle / "policy.onnx"))
    manifest = read_manifest(bundle, verify=False)
    manifest["files"]["policy.onnx"] = file_entry(bundle, "policy.onnx", kind="onnx", precision="fp32")
    write_manifest(bundle, manifest)
    with pytest.raises(SacEdgeError, match=r"opset 99, onnxruntime [\d.]+ supports up to \d+: pip install -U"):
        open_backend(open_bundle(bundle), "onnxruntime", "fp32")


def test_load_error_reads_the_ir_version_message() -> None:
    from sac_edge.edge_runtime.backends.onnxrt.runner import load_error

    message = "Load model failed: Unsupported model IR version: 12, max supported IR version: 9"  # onnxruntime 1.16
    assert str(load_error(Path("p.onnx"), message, "1.16.3")).startswith(
        "p.onnx needs ONNX IR version 12, onnxruntime 1.16.3 supports up to 9: pip install -U onnxruntime"
    )


def test_a_missing_optional_dependency_names_the_install(
    pendulum_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in ("torch", "tensorrt") else real(name, *a)
    )
    bundle = open_bundle(pendulum_bundle)
    with pytest.raises(SacEdgeError, match=r"'torch' is not installed \(pip install 'sac-edge\[finetune\]'\)"):
        open_backend(bundle, "torch", "fp32")
    with pytest.raises(SacEdgeError, match=r"'tensorrt' is not installed \(TensorRT >= 8.5: sudo apt install"):
        open_backend(bundle, "tensorrt", "fp32")


def test_the_tensorrt_provider_gets_fixed_profiles_and_larger_batches_run_in_chunks(pendulum_bundle: Path) -> None:
    """The TensorRT provider's engine is built once for batch 1..64 (no rebuild when a new batch size
    arrives); a larger act_batch runs in chunks of 64, which the CPU provider shows row for row."""
    from sac_edge.edge_runtime.backends.onnxrt.loader import TRT_EP_MAX_BATCH, trt_ep_profile
    from sac_edge.edge_runtime.backends.onnxrt.runner import OrtBackend

    assert trt_ep_profile(3, "1.16.3") == {
        "trt_profile_min_shapes": "obs:1x3",
        "trt_profile_opt_shapes": "obs:1x3",
        "trt_profile_max_shapes": "obs:64x3",
    }
    assert trt_ep_profile(3, "1.14.1") == {}  # an older onnxruntime: the options may not exist there
    bundle = open_bundle(pendulum_bundle)
    model = bundle.onnx("fp32")
    assert model is not None
    chunked = OrtBackend("onnxruntime", bundle, "fp32", model, ["CPUExecutionProvider"], BackendOptions(), 64)
    seen: list[int] = []
    session = chunked._runner.session

    class Recording:
        def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.append(len(feed["obs"]))
            return session.run(names, feed)

    chunked._runner = chunked._runner._replace(session=Recording())
    obs = np.random.default_rng(0).normal(size=(150, 3)).astype(np.float32)
    whole = open_backend(bundle, "onnxruntime", "fp32", BackendOptions()).act_batch(obs)
    np.testing.assert_allclose(chunked.act_batch(obs), whole, rtol=1e-6, atol=1e-6)
    assert seen == [TRT_EP_MAX_BATCH, TRT_EP_MAX_BATCH, 150 - 2 * TRT_EP_MAX_BATCH]
    assert chunked.act_batch(obs[:0]).shape == (0, 1)
