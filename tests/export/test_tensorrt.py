"""TensorRT engine builder: the no-TensorRT behaviour runs everywhere; the builds need TensorRT and a GPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from sac_edge.common.bundle_format import TIMING_CACHE, plan_name
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.tolerance import tolerance
from sac_edge.common.trt.builder import (
    BuildSettings,
    EngineSource,
    build_engine,
    cuda_device,
    engine_inputs,
    tensorrt_unavailable,
    tensorrt_version,
)
from sac_edge.common.trt.generations import generation
from sac_edge.export.fp16_onnx import write_fp16
from sac_edge.export.onnx_export import export_policy
from sac_edge.export.source import load_source

# Pendulum's action range [-2, 2]: the product's own engine tolerances (an fp32 engine may use TF32, on by
# default on Ampere/Orin and later, and reorder sums, so 1e-4 would refuse correct engines there).
FP32_TOL, FP16_TOL = tolerance("fp32", [-2.0], [2.0]), tolerance("fp16", [-2.0], [2.0])


def test_engine_inputs_per_tensorrt_version(tmp_path: Path) -> None:
    assert engine_inputs(tmp_path, "fp16", "8.5.2") == (tmp_path / "policy.onnx", None)
    assert engine_inputs(tmp_path, "int8", "8.5.2") == (tmp_path / "policy.int8.onnx", None)  # no cache: Q/DQ
    (tmp_path / "calib.cache").write_text("TRT-8502-EntropyCalibration2\n")
    assert engine_inputs(tmp_path, "int8", "8.6.1") == (tmp_path / "policy.onnx", tmp_path / "calib.cache")
    assert engine_inputs(tmp_path, "int8", "10.3.0") == (tmp_path / "policy.int8.onnx", None)
    assert engine_inputs(tmp_path, "fp16", "10.3.0") == (tmp_path / "policy.onnx", None)
    assert engine_inputs(tmp_path, "fp16", "11.4.0") == (tmp_path / "policy.fp16.onnx", None)  # strongly typed
    assert engine_inputs(tmp_path, "int8", "11.4.0") == (tmp_path / "policy.int8.onnx", None)
    assert plan_name("int8") == "policy.int8.plan"


def test_without_tensorrt_build_is_a_clear_error(tmp_path: Path) -> None:
    reason = tensorrt_unavailable()
    if reason is None:
        pytest.skip("TensorRT and a GPU are present here")
    with pytest.raises(SacEdgeError, match="cannot build a TensorRT engine"):
        build_engine(EngineSource(tmp_path / "policy.onnx", "fp16"), tmp_path / "policy.fp16.plan")
    with pytest.raises(SacEdgeError, match="unknown precision"):
        build_engine(EngineSource(tmp_path / "policy.onnx", "int4"), tmp_path / "x.plan")


def test_cuda_device_query_is_safe() -> None:
    device = cuda_device()
    assert device is None or (device.name and device.compute_capability.count(".") == 1)


@pytest.fixture(scope="module")
def onnx_file(pendulum_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = load_source(str(pendulum_run))
    path = tmp_path_factory.mktemp("trt") / "policy.onnx"
    export_policy(source.policy, source.spec.obs_dim, path)
    write_fp16(path, path.with_name("policy.fp16.onnx"), "obs", "action")  # what TensorRT 11 builds fp16 from
    return path


def _run_engine(plan: Path, obs: np.ndarray) -> np.ndarray:
    """Run a plan with torch CUDA buffers through the name-based API (execute_async_v3, TRT >= 8.5)."""
    import tensorrt as trt
    import torch

    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan.read_bytes())
    context = engine.create_execution_context()
    x = torch.as_tensor(obs, device="cuda").contiguous()
    context.set_input_shape("obs", tuple(x.shape))
    y = torch.empty(tuple(context.get_tensor_shape("action")), device="cuda")
    context.set_tensor_address("obs", x.data_ptr())
    context.set_tensor_address("action", y.data_ptr())
    stream = torch.cuda.Stream()
    assert context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return y.cpu().numpy()


def _ort(path: Path, obs: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["action"], {"obs": obs})[0]


@pytest.mark.tensorrt
@pytest.mark.parametrize(("precision", "tol"), [("fp32", FP32_TOL), ("fp16", FP16_TOL)])
def test_build_engine_matches_onnxruntime(onnx_file: Path, precision: str, tol: float) -> None:
    plan = onnx_file.with_name(plan_name(precision))
    source, _ = engine_inputs(onnx_file.parent, precision, tensorrt_version())
    info = build_engine(
        EngineSource(source, precision), plan, BuildSettings(batch=(1, 1, 64), workspace_bytes=64 << 20)
    )
    assert plan.is_file() and (plan.parent / TIMING_CACHE).is_file()
    assert "REFIT" not in info.flags and info.profile == {"obs": [1, 1, 64]} and info.profiles == 2
    assert info.io_tensors == ("obs", "action") and info.tensorrt_version and info.compute_capability
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    for batch in (1, 64):
        np.testing.assert_allclose(_run_engine(plan, obs[:batch]), _ort(onnx_file, obs[:batch]), atol=tol)


@pytest.mark.tensorrt
def test_engine_non_finite_observation_gives_finite_action(onnx_file: Path) -> None:
    plan = onnx_file.with_name("nan.plan")
    build_engine(EngineSource(onnx_file, "fp32"), plan, BuildSettings(workspace_bytes=64 << 20))
    obs = np.array([[np.nan, 0.1, 0.2], [np.inf, -np.inf, np.nan], [0.3, 0.4, 0.5]], np.float32)
    got = _run_engine(plan, obs)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, _ort(onnx_file, obs), atol=FP32_TOL)


@pytest.mark.tensorrt
def test_engine_is_refittable_by_onnx_initializer_names(onnx_file: Path) -> None:
    import tensorrt as trt

    plan = onnx_file.with_name("refit.plan")
    build_engine(EngineSource(onnx_file, "fp32"), plan, BuildSettings(workspace_bytes=64 << 20, refit=True))
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan.read_bytes())
    names = set(trt.Refitter(engine, logger).get_all_weights())
    assert {"actor.trunk.0.weight", "actor.mu.weight"} <= names


@pytest.mark.tensorrt
def test_int8_engine_from_bundle(pendulum_run: Path, tmp_path: Path) -> None:
    """The INT8 engine from what the bundle carries for this TensorRT (Q/DQ on 10, calib.cache on 8.x)."""
    from sac_edge.export.cli import main

    bundle = tmp_path / "bundle"
    args = [str(pendulum_run), "--out", str(bundle), "--int8", "--calib-samples", "256", "--gate-episodes", "2"]
    assert main([*args, "--engine", "never"]) == 0
    if not (bundle / "policy.int8.onnx").is_file():
        pytest.skip("the gate rejected INT8 for this policy")
    onnx_path, cache = engine_inputs(bundle, "int8", tensorrt_version())
    plan = tmp_path / "policy.int8.plan"
    info = build_engine(EngineSource(onnx_path, "int8", cache), plan, BuildSettings(workspace_bytes=64 << 20))
    assert info.int8_source == ("calib.cache" if cache else "explicit Q/DQ")
    # the INT8 flag only where the generation has precision flags (none on 10.12+ and 11: strongly typed)
    assert ("INT8" in info.flags) == generation(info.tensorrt_version).precision_flags
    assert info.int8_layers > 0  # what says INT8 on every generation: the inspector's INT8 layers
    obs = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
    np.testing.assert_allclose(_run_engine(plan, obs), _ort(bundle / "policy.onnx", obs), atol=0.1)
