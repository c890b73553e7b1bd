"""Shared fixtures: a real fp32 policy.onnx (torch.onnx.export of InferencePolicy, built from a small SAC
policy that sac-train trained on Pendulum-v1, see make_pendulum_fixture.py) and Pendulum state sets."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from safetensors import safe_open

from sac_edge.calibration.states import StateSets, build_state_sets
from sac_edge.common.spec import PolicySpec
from sac_edge.train.checkpoint import inference_policy

FIXTURE = Path(__file__).parent / "data" / "pendulum_sac.safetensors"


def _fixture() -> tuple[PolicySpec, dict[str, torch.Tensor]]:
    with safe_open(str(FIXTURE), framework="pt") as fh:
        spec = PolicySpec.from_dict(json.loads(fh.metadata()["spec"]))
        return spec, {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is not a dict)


def export_policy(spec: PolicySpec, tensors: dict[str, torch.Tensor], path: Path) -> Path:
    """torch.onnx.export of the deployment policy (dynamic batch, names obs/action), as export/ does."""
    policy = inference_policy(spec, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            policy,
            (torch.zeros(1, spec.obs_dim),),
            str(path),
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    return path


@pytest.fixture(scope="session")
def trained() -> tuple[PolicySpec, dict[str, torch.Tensor]]:
    return _fixture()


@pytest.fixture(scope="session")
def spec(trained: tuple[PolicySpec, dict[str, torch.Tensor]]) -> PolicySpec:
    return trained[0]


@pytest.fixture(scope="session")
def fp32_onnx(tmp_path_factory: pytest.TempPathFactory, trained: tuple[PolicySpec, dict[str, torch.Tensor]]) -> Path:
    return export_policy(*trained, tmp_path_factory.mktemp("fp32") / "policy.onnx")


@pytest.fixture(scope="session")
def fp32_model(fp32_onnx: Path) -> onnx.ModelProto:
    return onnx.load(str(fp32_onnx))


@pytest.fixture(scope="session")
def replay(trained: tuple[PolicySpec, dict[str, torch.Tensor]]) -> np.ndarray:
    """600 rows of the training run's calib_states.npy (replay-buffer observations)."""
    return trained[1]["calib_states"].numpy()


@pytest.fixture(scope="session")
def states(fp32_onnx: Path, spec: PolicySpec, replay: np.ndarray) -> StateSets:
    return build_state_sets(fp32_onnx, spec, calib_samples=1024, holdout_samples=512, replay=replay, seed=0)
