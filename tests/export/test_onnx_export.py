"""policy.onnx: interface, checks, TensorRT 8.5 op set, non-finite observations, dynamic batch."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from sac_edge.common.errors import InternalError
from sac_edge.export.onnx_export import IR_VERSION, OPSET, TENSORRT_85_OPS, check_tensorrt_ops, export_policy
from sac_edge.export.source import load_source
from sac_edge.train.policies import Actor, InferencePolicy, ObsNormalizer


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _act(sess: ort.InferenceSession, obs: np.ndarray) -> np.ndarray:
    return sess.run(["action"], {"obs": np.asarray(obs, np.float32)})[0]


@pytest.fixture(scope="module")
def exported(pendulum_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, InferencePolicy]:
    source = load_source(str(pendulum_run))
    path = tmp_path_factory.mktemp("onnx") / "policy.onnx"
    export_policy(source.policy, source.spec.obs_dim, path)
    return path, source.policy


def test_graph_interface_checks_and_tensorrt_ops(exported: tuple[Path, InferencePolicy]) -> None:
    path, _ = exported
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["obs"] and [o.name for o in model.graph.output] == ["action"]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 3
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [OPSET]
    assert model.ir_version <= IR_VERSION
    ops = {n.op_type for n in model.graph.node}
    assert ops <= TENSORRT_85_OPS and "IsInf" not in ops
    # training-only or folded-away parts are gone: no log-std head, no Identity/Dropout
    names = {i.name for i in model.graph.initializer}
    assert {"actor.trunk.0.weight", "actor.mu.weight"} <= names and "actor.log_std.weight" not in names
    assert not ops & {"Identity", "Dropout"}


def test_dynamic_batch_matches_torch(exported: tuple[Path, InferencePolicy]) -> None:
    path, policy = exported
    sess = _session(path)
    rng = np.random.default_rng(0)
    for batch in (1, 7, 64):
        obs = rng.normal(size=(batch, 3)).astype(np.float32)
        with torch.inference_mode():
            want = policy(torch.as_tensor(obs)).numpy()
        got = _act(sess, obs)
        assert got.shape == (batch, 1)
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.all(np.abs(got) <= 2.0 + 1e-6)


def test_non_finite_observation_gives_finite_action(exported: tuple[Path, InferencePolicy]) -> None:
    path, policy = exported
    sess = _session(path)
    mean = policy.obs_mean.numpy()
    base = np.tile(np.array([0.3, -0.2, 1.0], np.float32), (6, 1))
    bad = base.copy()
    bad[0, 0] = np.nan
    bad[1, 2] = np.inf
    bad[2, 1] = -np.inf
    bad[3] = np.nan
    bad[4] = [np.inf, -np.inf, np.nan]
    bad[5, 2] = 3e38
    got = _act(sess, bad)
    assert np.all(np.isfinite(got))
    # a NaN component is the mean after normalisation (0), and the torch policy agrees on every row
    ref = base[:1].copy()
    ref[0, 0] = mean[0]
    np.testing.assert_allclose(got[0], _act(sess, ref)[0], atol=1e-6)
    with torch.inference_mode():
        np.testing.assert_allclose(got, policy(torch.as_tensor(bad)).numpy(), atol=1e-5)
    # +inf clamps like a very large value
    big = base[1:2].copy()
    big[0, 2] = 1e30
    np.testing.assert_allclose(got[1], _act(sess, big)[0], atol=1e-6)


def test_unnormalised_policy_stays_finite(tmp_path: Path) -> None:
    """clip=inf (no normalisation, as for SB3 policies) must still map ±inf to a finite action."""
    torch.manual_seed(0)
    norm = ObsNormalizer(4, clip=math.inf)
    policy = InferencePolicy(Actor(4, 2, (32, 32)), norm, torch.tensor([-1.0, -3.0]), torch.tensor([1.0, 3.0]))
    export_policy(policy, 4, tmp_path / "p.onnx")
    obs = np.array([[np.inf, -np.inf, np.nan, 1.0], [50.0, -40.0, 3.0, 2.0]], np.float32)
    got = _act(_session(tmp_path / "p.onnx"), obs)
    assert np.all(np.isfinite(got))
    with torch.inference_mode():
        np.testing.assert_allclose(got[1], policy(torch.as_tensor(obs[1:]))[0].numpy(), atol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_op_check_rejects_what_tensorrt_85_cannot_parse(tmp_path: Path) -> None:
    class NanToNum(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nan_to_num(x, nan=0.0)

    torch.onnx.export(NanToNum(), (torch.zeros(1, 3),), str(tmp_path / "n.onnx"), dynamo=False, opset_version=OPSET)
    with pytest.raises(InternalError, match="IsInf"):
        check_tensorrt_ops(onnx.load(str(tmp_path / "n.onnx")))
