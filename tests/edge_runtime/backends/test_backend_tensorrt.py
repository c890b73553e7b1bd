"""TensorRT plan caching: a plan built for another TensorRT version or device is never loaded.

The record comparison and the cache lookup run without TensorRT; the engine runner itself is
tensorrt-marked (skipped here, run on a GPU machine).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import file_entry, read_manifest, write_manifest
from sac_edge.edge_runtime.backends.base import BackendOptions
from sac_edge.edge_runtime.backends.registry import open_backend
from sac_edge.edge_runtime.backends.trt.plans import (
    PlanKey,
    cached_plan_paths,
    find_plan,
    plan_mismatch,
    write_sidecar,
)

KEY = PlanKey("8.5.2", "Xavier", "7.2", "ab" * 32, "fp16")
SHIPPED_PLAN = {  # what sac-export records for a plan it ships (manifest "tensorrt"): no ONNX hash
    "tensorrt_version": "8.5.2",
    "device": "Xavier",
    "compute_capability": "7.2",
    "precision": "fp16",
    "refit": False,
    "profiles": 2,
}


def test_plan_mismatch_names_the_field() -> None:
    assert plan_mismatch(KEY._asdict(), KEY) is None
    assert "tensorrt" in str(plan_mismatch({**KEY._asdict(), "tensorrt": "10.3.0"}, KEY))
    assert "device" in str(plan_mismatch({**KEY._asdict(), "device": "Orin"}, KEY))
    assert "compute_capability" in str(plan_mismatch({**KEY._asdict(), "compute_capability": "8.7"}, KEY))
    assert "onnx_sha256" in str(plan_mismatch({**KEY._asdict(), "onnx_sha256": "00"}, KEY))
    assert "precision" in str(plan_mismatch({**KEY._asdict(), "precision": "int8"}, KEY))
    # export's manifest record: tensorrt_version, no ONNX hash
    shipped = dict(SHIPPED_PLAN)
    assert plan_mismatch(shipped, KEY) is None
    assert "refit" in str(plan_mismatch(shipped, KEY._replace(refit=True)))  # --finetune needs a REFIT plan
    assert "calib_sha256" in str(plan_mismatch({**KEY._asdict(), "calib_sha256": "00"}, KEY))
    old = {k: v for k, v in shipped.items() if k != "profiles"}  # a one-profile plan from before: rebuilt
    assert "profiles" in str(plan_mismatch(old, KEY))
    assert plan_mismatch({k: v for k, v in shipped.items() if k != "device"}, KEY) is not None


def test_key_tag_is_a_safe_file_name() -> None:
    assert PlanKey("10.8.0.43", "NVIDIA H200 (PCIe)", "9.0", "x", "fp32").tag() == "trt10.8.0.43-nvidia-h200-pcie-sm90"
    assert KEY._replace(refit=True).tag().endswith("-refit")


def _cache(tmp_path: Path, key: PlanKey) -> Path:
    plan, _ = cached_plan_paths(tmp_path, key)
    plan.write_bytes(b"serialized engine")
    write_sidecar(plan, key, {"flags": ["REFIT"]})
    return plan


def test_cached_plan_is_used_only_for_its_own_key(tmp_path: Path, pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    plan = _cache(tmp_path, KEY)
    assert find_plan(bundle, KEY, tmp_path) == (plan, [])
    other_version = KEY._replace(tensorrt="10.3.0")
    found, _ = find_plan(bundle, other_version, tmp_path)
    assert found is None  # different file name key: never looked at, so rebuilt
    # a plan whose sidecar says another device (copied in by hand) is skipped with the reason
    sidecar = plan.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**record, "device": "Orin"}))
    found, skipped = find_plan(bundle, KEY, tmp_path)
    assert found is None and "device" in skipped[0]


def test_a_corrupt_or_unrecorded_plan_is_rebuilt(tmp_path: Path, pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    plan = _cache(tmp_path, KEY)
    plan.write_bytes(b"truncated")
    found, skipped = find_plan(bundle, KEY, tmp_path)
    assert found is None and "sha256" in skipped[0]
    plan.with_suffix(".json").unlink()
    found, skipped = find_plan(bundle, KEY, tmp_path)
    assert found is None and "sidecar" in skipped[0]


def test_plan_shipped_in_the_bundle_is_checked_against_its_manifest_record(
    tmp_path: Path, pendulum_bundle: Path
) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    (root / "policy.fp16.plan").write_bytes(b"engine from export")
    manifest = read_manifest(root)
    manifest["files"]["policy.fp16.plan"] = file_entry(
        root, "policy.fp16.plan", kind="tensorrt-engine", precision="fp16"
    )
    manifest["tensorrt"] = {"fp16": {"status": "built", **SHIPPED_PLAN}}
    write_manifest(root, manifest)
    bundle = open_bundle(root)
    assert find_plan(bundle, KEY, tmp_path / "engines")[0] == root / "policy.fp16.plan"
    found, skipped = find_plan(bundle, KEY._replace(device="Orin"), tmp_path / "engines")
    assert found is None and "policy.fp16.plan" in skipped[0]


@pytest.mark.tensorrt
def test_tensorrt_engine_matches_onnxruntime(tmp_path: Path, pendulum_bundle: Path) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    bundle = open_bundle(root)
    trt_backend = open_backend(bundle, "tensorrt", "fp32")
    assert trt_backend.describe()["built"] is True
    assert trt_backend.describe()["parity"]["passed"] and trt_backend.describe()["parity"]["when"] == "build"
    ort = open_backend(bundle, "onnxruntime", "fp32")
    obs = np.random.default_rng(0).standard_normal((70, 3)).astype(np.float32)
    np.testing.assert_allclose(trt_backend.act_batch(obs), ort.act_batch(obs), atol=1e-4)
    out = trt_backend.act(obs[0])
    assert trt_backend.act(obs[1]) is out
    np.testing.assert_allclose(out, ort.act(obs[1]), atol=1e-4)
    again = open_backend(open_bundle(root), "tensorrt", "fp32")
    assert again.describe()["built"] is False  # the cached plan is reused on the same device
    trt_backend.close()
    again.close()


@pytest.mark.tensorrt
def test_tensorrt_refit_swap(tmp_path: Path, pendulum_bundle: Path) -> None:
    from safetensors.numpy import load_file

    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    bundle = open_bundle(root)
    trt_backend = open_backend(bundle, "tensorrt", "fp32", BackendOptions(refit=True))
    ort = open_backend(bundle, "onnxruntime", "fp32")
    weights = {k: v * -0.5 for k, v in load_file(str(root / "learner.safetensors")).items() if k.startswith("actor.")}
    trt_backend.swap_weights(weights)
    ort.swap_weights(weights)
    obs = np.array([0.1, 0.2, 0.3], np.float32)
    np.testing.assert_allclose(trt_backend.act(obs), ort.act(obs), atol=1e-4)
    assert trt_backend.parity is not None and trt_backend.parity["when"] == "refit" and trt_backend.parity["passed"]
    trt_backend.close()
    with pytest.raises(SacEdgeError, match="without REFIT"):  # a plan built for serving only
        open_backend(bundle, "tensorrt", "fp32").swap_weights(weights)


@pytest.mark.tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_tensorrt_every_precision_passes_the_gate_and_act_batch_is_real(
    tmp_path: Path, pendulum_bundle: Path, precision: str
) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    backend = open_backend(open_bundle(root), "tensorrt", precision)
    parity = backend.describe()["parity"]
    assert parity["passed"] and parity["states"] > 0, parity
    sidecar = json.loads(backend.plan.with_suffix(".json").read_text())
    assert sidecar["parity"]["passed"] and sidecar["build"]["profiles"] == 2
    backend.close()


@pytest.mark.tensorrt
def test_tensorrt_plan_that_disagrees_is_deleted_and_not_served(tmp_path: Path, pendulum_bundle: Path) -> None:
    """A cached plan built from a graph with a perturbed bias, recorded as if it were the bundle's."""
    import onnx
    from onnx import numpy_helper

    from sac_edge.common.trt.builder import BuildSettings, EngineSource, build_engine
    from sac_edge.edge_runtime.backends.parity_gate import ParityError

    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    good = open_backend(open_bundle(root), "tensorrt", "fp32")
    plan, key = good.plan, good.key
    good.close()
    model = onnx.load(str(root / "policy.onnx"))
    bias = [i for i in model.graph.initializer if i.name.endswith("bias")][-1]
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias) + np.float32(0.5), bias.name))
    wrong = tmp_path / "wrong.onnx"
    onnx.save(model, str(wrong))
    build_engine(EngineSource(wrong, "fp32"), plan, BuildSettings(batch=(1, 1, 64)))
    write_sidecar(plan, key, {"note": "built from a perturbed graph"})
    with pytest.raises(ParityError, match="plan deleted, not served"):
        open_backend(open_bundle(root), "tensorrt", "fp32")
    assert not plan.exists()
    assert json.loads(plan.with_suffix(".json").read_text())["parity"]["passed"] is False


@pytest.mark.tensorrt
def test_tensorrt_act_batch_beside_act_in_another_thread(tmp_path: Path, pendulum_bundle: Path) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    bundle = open_bundle(root)
    trt_backend, ort = open_backend(bundle, "tensorrt", "fp32"), open_backend(bundle, "onnxruntime", "fp32")
    rng = np.random.default_rng(1)
    single, batch = rng.standard_normal(3).astype(np.float32), rng.standard_normal((64, 3)).astype(np.float32)
    want_single, want_batch = ort.act(single).copy(), ort.act_batch(batch)
    stop, bad = threading.Event(), []

    def batches() -> None:
        while not stop.is_set():
            if not np.allclose(trt_backend.act_batch(batch), want_batch, atol=1e-4):
                bad.append("act_batch")

    worker = threading.Thread(target=batches)
    worker.start()
    try:
        for _ in range(2000):  # act's buffers and stream are its own: the batch never lands in them
            if not np.allclose(trt_backend.act(single), want_single, atol=1e-4):
                bad.append("act")
    finally:
        stop.set()
        worker.join()
    trt_backend.close()
    assert not bad, bad[:5]


def _fake_device(monkeypatch: pytest.MonkeyPatch, version: str, device: bool) -> None:
    """``version``'s fake tensorrt; libcuda reports a GPU, which TensorRT can use only when ``device``."""
    from fake_tensorrt import fake_tensorrt

    from sac_edge.common.trt import builder as export_trt

    trt, _ = fake_tensorrt(version, device=device)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(export_trt, "_probe_cuda", lambda index=0: export_trt.CudaDevice("Xavier", "7.2"))


@pytest.mark.parametrize("version", ["8.5.3.1", "10.3.0", "11.4.0.106"])
def test_runner_names_why_tensorrt_cannot_start(
    monkeypatch: pytest.MonkeyPatch, pendulum_bundle: Path, version: str
) -> None:
    from fake_tensorrt import NO_DEVICE

    from sac_edge.edge_runtime.backends.trt.runner import TensorRTBackend

    _fake_device(monkeypatch, version, device=False)
    with pytest.raises(SacEdgeError) as err:
        TensorRTBackend(open_bundle(pendulum_bundle), "fp32", BackendOptions())
    assert str(err.value).startswith(f"TensorRT could not create a runtime: {NO_DEVICE}") and err.value.exit_code == 2


def test_runner_and_registry_without_a_cuda_device(monkeypatch: pytest.MonkeyPatch, pendulum_bundle: Path) -> None:
    from sac_edge.common.trt import builder as export_trt
    from sac_edge.edge_runtime.backends.trt.runner import TensorRTBackend

    _fake_device(monkeypatch, "10.3.0", device=False)
    gone = "no CUDA device usable: libcuda.so.1 is not installed (no NVIDIA driver)"
    monkeypatch.setattr(export_trt, "_probe_cuda", lambda index=0: gone)
    with pytest.raises(SacEdgeError, match=f"backend 'tensorrt': {re.escape(gone)}; use --backend onnxruntime"):
        TensorRTBackend(open_bundle(pendulum_bundle), "fp32", BackendOptions())
    with pytest.raises(SacEdgeError, match=re.escape(gone)):  # the registry refuses it before opening
        open_backend(open_bundle(pendulum_bundle), "tensorrt", "fp32")


@pytest.mark.parametrize(("version", "refit_plan"), [("10.3.0", True), ("11.4.0.106", False)])
def test_refit_only_where_tensorrt_builds_it_safely(
    version: str, refit_plan: bool, pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 11.3 (the known issue: a REFIT build can drop a matrix-multiply bias) --finetune's engine is built
    without REFIT and a swap rebuilds it from the graph with the new weights; before, the plan is refitted."""
    import onnx
    from fake_pycuda import fake_runner
    from onnx import numpy_helper

    from sac_edge.common.trt.generations import refit_is_safe

    assert [refit_is_safe(v) for v in ("8.5.2", "10.13.3.9", "11.2.0", "11.3.0", "11.4.0.106")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    runner, used, _ = fake_runner(version, monkeypatch)
    backend = runner.TensorRTBackend(
        open_bundle(pendulum_bundle), "fp32", BackendOptions(refit=True, engine_dir=tmp_path)
    )
    assert ("set_flag:BuilderFlag.REFIT" in used) == refit_plan and backend.key.refit == refit_plan
    graph = onnx.load(str(pendulum_bundle / "policy.onnx")).graph
    weights = {i.name: numpy_helper.to_array(i) + 1 for i in graph.initializer if i.name.endswith(".bias")}
    used.clear()
    report = backend.swap_weights(weights)
    assert report.applied + len(report.ignored) == len(weights) and backend.swaps == 1
    assert refit_plan or report.applied == len(weights)  # a rebuild installs every graph initializer named
    assert ("Refitter" in used) == refit_plan  # no refitter at all where swaps rebuild
    assert ("set_flag:BuilderFlag.REFIT" in used) is False  # a rebuild is never REFIT there either
    assert backend.describe()["swaps"] == ("refit" if refit_plan else "rebuild")
    backend.close()
