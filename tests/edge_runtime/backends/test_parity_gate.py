"""The engine parity gate, with real onnxruntime sessions standing in for the engine under test: the
bundle's own graph passes, a graph with a perturbed bias (what a dropped GEMM bias or a stale engine cache
serves) fails, is not served, and --backend auto goes on to the next candidate with the reason. The gate
is declared per backend kind and the registry enforces it: a new gated kind whose engine fails at open is
never returned, and a swap it does not fully take is never published."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import PRECISIONS
from sac_edge.common.manifest import file_entry, read_manifest, write_manifest
from sac_edge.edge_runtime.backends.autoselect import autoselect
from sac_edge.edge_runtime.backends.base import BackendKind, BackendOptions
from sac_edge.edge_runtime.backends.onnxrt.runner import OrtBackend, swap_providers
from sac_edge.edge_runtime.backends.parity_gate import (
    INT8_KERNEL_FRAC,
    ParityError,
    check_backend,
    gate_states,
    judge,
    reference_actions,
    require,
)
from sac_edge.edge_runtime.backends.registry import KINDS, open_backend
from sac_edge.edge_runtime.backends.trt.plans import parity_records, record_parity

CPU = ["CPUExecutionProvider"]


def _variant(
    source: Path, tmp_path: Path, name: str, graph: str, edit: Callable[[onnx.ModelProto], None]
) -> tuple[Bundle, Path]:
    """A copy of the bundle ``source`` that also lists ``name``: its ``graph`` changed by ``edit``
    (everything else identical), opened with open_bundle so the backend is served the changed graph's
    verified bytes like any bundle file."""
    root = tmp_path / "bundle"
    shutil.copytree(source, root)
    model = onnx.load(str(root / graph))
    edit(model)
    onnx.save(model, str(root / name))
    manifest = read_manifest(root)
    manifest["files"][name] = file_entry(root, name, kind="onnx", precision="perturbed")
    write_manifest(root, manifest)
    return open_bundle(root), root / name


def _changed(
    model: onnx.ModelProto, initializer: Callable[[str], bool], change: Callable[[np.ndarray], np.ndarray]
) -> None:
    """The last initializer whose name ``initializer`` accepts, replaced by ``change`` of its value."""
    init = [i for i in model.graph.initializer if initializer(i.name)][-1]
    init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init)), init.name))


def _perturbed(source: Path, tmp_path: Path, name: str, delta: float = 0.5) -> tuple[Bundle, Path]:
    """The bundle with ``name``: policy.onnx with the last layer's bias shifted by ``delta``."""

    def edit(model: onnx.ModelProto) -> None:
        _changed(model, lambda n: n.endswith("bias"), lambda v: v + np.float32(delta))

    return _variant(source, tmp_path, name, "policy.onnx", edit)


def _engine(bundle: Bundle, model: Path, precision: str = "fp32", name: str = "engine-under-test") -> OrtBackend:
    return OrtBackend(name, bundle, precision, model, CPU, BackendOptions())


def test_the_reference_itself_passes_with_zero_error(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    parity = check_backend(_engine(bundle, bundle.path / "policy.onnx"), bundle, "session")
    assert parity.passed and parity.max_abs == 0.0 and parity.rule == "max abs action error"
    assert "seeded normal" in parity.state_source  # this fixture bundle predates parity_states.npy


def test_a_perturbed_bias_fails_the_gate_in_one_line(pendulum_bundle: Path, tmp_path: Path) -> None:
    bundle, model = _perturbed(pendulum_bundle, tmp_path, "wrong.onnx")
    wrong = _engine(bundle, model)
    parity = check_backend(wrong, bundle, "build")
    assert not parity.passed and parity.max_abs > parity.limit
    with pytest.raises(ParityError, match=r"parity gate FAILED for engine-under-test/fp32 \(build\)") as err:
        require(parity, "plan deleted, not served")
    assert "\n" not in str(err.value) and err.value.exit_code == 1 and err.value.parity == parity
    # fp16's wider tolerance does not hide it either
    assert not check_backend(_engine(bundle, model, "fp16"), bundle, "build").passed


def test_a_tiny_perturbation_passes_fp16_but_not_fp32(pendulum_bundle: Path, tmp_path: Path) -> None:
    bundle, model = _perturbed(pendulum_bundle, tmp_path, "close.onnx", delta=5e-3)  # ~1e-2 in env units (range 4)
    assert not check_backend(_engine(bundle, model, "fp32"), bundle, "build").passed  # fp32 tol 1e-3 * 4
    assert check_backend(_engine(bundle, model, "fp16"), bundle, "build").passed


def test_int8_is_judged_against_the_qdq_graph_it_implements(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    parity = check_backend(_engine(bundle, bundle.path / "policy.int8.onnx", "int8"), bundle, "build")
    assert parity.passed and parity.rule == "mean action error / range against the Q/DQ graph"
    assert parity.value == 0.0 and parity.limit == INT8_KERNEL_FRAC
    assert parity.max_abs > 0  # against fp32 int8 really differs...
    assert parity.fp32_value == parity.reference_fp32_value  # ...by exactly the Q/DQ graph's own error
    assert parity.fp32_limit == pytest.approx(parity.fp32_value + INT8_KERNEL_FRAC)
    assert "against fp32" in parity.line()


def test_a_correct_int8_engine_near_the_accuracy_limit_is_served(pendulum_bundle: Path) -> None:
    """The Q/DQ graph passed the accuracy gate at 0.99% of the range; an engine that implements it with
    kernel differences of 0.05% lands at 1.04% against fp32. The accuracy gate's 1% applied on the device
    would refuse it (and silently fall back); judged against the model it implements, it serves."""
    bundle = open_bundle(pendulum_bundle)
    states, source = gate_states(bundle)
    span = np.float32(bundle.spec.action_high[0] - bundle.spec.action_low[0])
    fp32 = reference_actions(bundle, states)
    qdq = fp32 + np.float32(0.0099) * span
    engine = qdq + np.float32(0.0005) * span
    old = judge(engine, fp32, bundle, "tensorrt", "int8", "build", source)
    new = judge(engine, fp32, bundle, "tensorrt", "int8", "build", source, qdq)
    assert not old.passed and old.value == pytest.approx(0.0104, rel=1e-3)
    assert new.passed and new.value == pytest.approx(0.0005, rel=1e-2)
    assert new.fp32_value == pytest.approx(0.0104, rel=1e-3) and new.fp32_limit == pytest.approx(0.0119, rel=1e-3)
    # kernel differences beyond the margin are refused even though the model was accurate
    drifted = qdq + np.float32(1.5 * INT8_KERNEL_FRAC) * span
    assert not judge(drifted, fp32, bundle, "tensorrt", "int8", "build", source, qdq).passed


def test_an_int8_engine_off_its_qdq_graph_fails_though_near_fp32(pendulum_bundle: Path, tmp_path: Path) -> None:
    """A stale int8 engine (here the Q/DQ graph with the output layer's weight scale 30% off, as an engine
    built with old scales serves) that still lands within 1% of fp32 passed the old rule; against the Q/DQ
    graph it implements it fails."""

    def edit(model: onnx.ModelProto) -> None:
        _changed(model, lambda n: n == "actor.mu.weight_scale", lambda v: v * np.float32(1.3))

    bundle, model = _variant(pendulum_bundle, tmp_path, "stale.int8.onnx", "policy.int8.onnx", edit)
    engine = _engine(bundle, model, "int8")
    parity = check_backend(engine, bundle, "build")
    assert not parity.passed and parity.value > INT8_KERNEL_FRAC
    states, source = gate_states(bundle)
    old = judge(engine.act_batch(states), reference_actions(bundle, states), bundle, "t", "int8", "build", source)
    assert old.passed and old.value < 0.01
    with pytest.raises(ParityError, match=r"against the Q/DQ graph .* against fp32"):
        require(parity, "not served")


def test_int8_without_a_qdq_graph_keeps_the_accuracy_gate_rule(pendulum_bundle: Path) -> None:
    bundle = open_bundle(pendulum_bundle)
    states, source = gate_states(bundle)
    fp32 = reference_actions(bundle, states)
    parity = judge(fp32, fp32, bundle, "tensorrt", "int8", "build", source)
    assert parity.passed and parity.rule == "mean action error / range" and parity.limit == 0.01
    assert parity.fp32_limit is None


def test_held_out_states_come_from_the_bundle(pendulum_bundle: Path, tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(pendulum_bundle, root)
    states = np.random.default_rng(3).normal(size=(100, 3)).astype(np.float32)
    np.save(root / "parity_states.npy", states)
    manifest = read_manifest(root)
    manifest["files"]["parity_states.npy"] = file_entry(root, "parity_states.npy", kind="parity-states")
    write_manifest(root, manifest)
    bundle = open_bundle(root)
    got, source = gate_states(bundle)
    np.testing.assert_array_equal(got, states)
    assert source == "parity_states.npy"


def _renamed(source: Path, tmp_path: Path, name: str) -> tuple[Bundle, Path, str]:
    """A copy of the bundle that also lists ``name``: its policy.onnx with the last bias under another name
    (the same actions, but a swap of that bias is not taken: what a refit that misses a weight serves)."""
    root = tmp_path / "bundle"
    shutil.copytree(source, root)
    model = onnx.load(str(root / "policy.onnx"))
    bias = [i for i in model.graph.initializer if i.name.endswith("bias")][-1]
    old = bias.name
    bias.name = "renamed.bias"
    for node in model.graph.node:
        node.input[:] = ["renamed.bias" if i == old else i for i in node.input]
    onnx.save(model, str(root / name))
    manifest = read_manifest(root)
    manifest["files"][name] = file_entry(root, name, kind="onnx", precision="renamed")
    write_manifest(root, manifest)
    return open_bundle(root), root / name, old


def _kind(name: str, model: Path | None, gated: tuple[str, ...]) -> BackendKind:
    """A backend kind serving ``model`` (default: the bundle's policy.onnx) on a real CPU session, declared
    gated at ``gated``, as a new device backend's loader would be."""

    def load(b: Bundle, precision: str, options: BackendOptions) -> OrtBackend:
        return OrtBackend(name, b, precision, model or b.path / "policy.onnx", CPU, options)

    return BackendKind(name, lambda: None, lambda b: ("fp32",), load, gated)


def test_reference_uses_the_swapped_weights(pendulum_bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from safetensors.numpy import load_file

    monkeypatch.setitem(KINDS, "onnxruntime-cuda", _kind("onnxruntime-cuda", None, ("fp32",)))
    bundle = open_bundle(pendulum_bundle)
    states, _ = gate_states(bundle)
    weights = {k: v * -0.5 for k, v in load_file(str(bundle.path / "learner.safetensors")).items()}
    swapped = open_backend(bundle, "onnxruntime-cuda", "fp32")
    assert swapped.parity is not None and swapped.parity["when"] == "session"  # gated at open
    swapped.swap_weights(weights)  # the swap itself is gated against the reference with the same weights
    assert swapped.parity is not None and swapped.parity["passed"] and swapped.parity["when"] == "swap"
    np.testing.assert_allclose(swapped.act_batch(states), reference_actions(bundle, states, weights), atol=1e-6)
    assert not np.allclose(reference_actions(bundle, states), reference_actions(bundle, states, weights))


def test_a_new_gated_kind_that_fails_at_open_is_never_served(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, wrong = _perturbed(pendulum_bundle, tmp_path, "wrong.onnx")
    monkeypatch.setitem(KINDS, "new-device", _kind("new-device", wrong, ("fp32",)))
    with pytest.raises(ParityError, match=r"parity gate FAILED for new-device/fp32 \(session\).*; not served"):
        open_backend(bundle, "new-device", "fp32")
    monkeypatch.setitem(KINDS, "new-device", _kind("new-device", wrong, ()))  # declared ungated: it serves
    assert open_backend(bundle, "new-device", "fp32").parity is None


def test_a_swap_a_gated_kind_does_not_take_is_never_published(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, renamed, bias = _renamed(pendulum_bundle, tmp_path, "renamed.onnx")
    monkeypatch.setitem(KINDS, "new-device", _kind("new-device", renamed, ("fp32",)))
    backend = open_backend(bundle, "new-device", "fp32")  # same actions as the reference: passes
    states, _ = gate_states(bundle)
    before = backend.act_batch(states)
    from safetensors.numpy import load_file

    weights = {bias: load_file(str(bundle.path / "learner.safetensors"))[bias] + np.float32(0.5)}
    with pytest.raises(ParityError, match=r"new-device/fp32 \(swap\).*; the swap was not applied") as err:
        backend.swap_weights(weights)
    assert not err.value.parity.passed and backend.swaps == 0
    assert backend.parity is not None and backend.parity["when"] == "session"  # the serving engine's verdict
    np.testing.assert_array_equal(backend.act_batch(states), before)  # still the weights that passed
    np.testing.assert_array_equal(np.stack([backend.act(s).copy() for s in states[:8]]), before[:8])
    ungated = _kind("new-device", renamed, ())  # the same swap on a kind declared ungated is published
    monkeypatch.setitem(KINDS, "new-device", ungated)
    assert open_backend(bundle, "new-device", "fp32").swap_weights(weights).ignored == (bias,)


def test_auto_falls_back_past_a_backend_that_fails_the_gate(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, wrong = _perturbed(pendulum_bundle, tmp_path, "wrong.onnx")
    monkeypatch.setitem(KINDS, "onnxruntime-tensorrt", _kind("onnxruntime-tensorrt", wrong, ("fp32",)))
    lines: list[str] = []
    chosen, measured = autoselect(
        bundle, BackendOptions(), ["fp32"], ["onnxruntime-tensorrt", "onnxruntime"], 20, 5, lines.append
    )
    assert (chosen.name, chosen.precision) == ("onnxruntime", "fp32")
    refused = [m for m in measured if m.backend == "onnxruntime-tensorrt"]
    assert refused and "parity gate FAILED" in str(refused[0].refusal) and "not served" in str(refused[0].refusal)
    assert any("onnxruntime-tensorrt/fp32: skipped (parity gate FAILED" in line for line in lines)
    chosen.close()


def test_every_device_kind_is_gated_at_every_precision_and_the_cpu_references_are_not() -> None:
    assert {name: k.gated for name, k in KINDS.items()} == {
        "tensorrt": PRECISIONS,
        "onnxruntime-tensorrt": PRECISIONS,
        "onnxruntime-cuda": PRECISIONS,
        "onnxruntime": (),
        "torch": (),
    }


def test_failed_plan_is_deleted_and_its_record_stays_for_doctor(tmp_path: Path, pendulum_bundle: Path) -> None:
    bundle, model = _perturbed(pendulum_bundle, tmp_path, "w.onnx")
    parity = check_backend(_engine(bundle, model), bundle, "cached plan")
    plan = tmp_path / "engines" / "policy.fp32.trt10.3.0-orin-sm87.plan"
    plan.parent.mkdir()
    plan.write_bytes(b"engine")
    plan.with_suffix(".json").write_text('{"precision": "fp32"}')
    record_parity(plan, parity.to_dict(), delete_plan=True)
    assert not plan.exists()
    (record,) = parity_records(tmp_path / "engines")
    assert record["plan"] == plan.name and record["passed"] is False and record["plan_deleted"] is True
    assert record["max_abs"] == parity.max_abs


def test_swapped_sessions_never_use_the_trt_engine_cache() -> None:
    providers = [("TensorrtExecutionProvider", {"trt_engine_cache_enable": True, "trt_fp16_enable": True}), "CPU"]
    swapped = swap_providers(providers)
    assert swapped[0] == ("TensorrtExecutionProvider", {"trt_engine_cache_enable": False, "trt_fp16_enable": True})
    assert swapped[1] == "CPU" and providers[0][1]["trt_engine_cache_enable"] is True  # the original is untouched
