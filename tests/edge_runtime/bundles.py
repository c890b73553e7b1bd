"""Test bundles laid out as sac-export writes them (docs/CONTRACTS.md, "Bundle"), from freshly initialised networks.

policy.onnx is the TorchScript export of ``InferencePolicy`` (dynamic batch, obs -> action),
policy.int8.onnx its symmetric Q/DQ quantisation by onnxruntime, learner.safetensors the learner tensors,
and the manifest lists every file with its sha256 plus the spec and an accuracy-gate section.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from sac_edge.common.bundle_format import ENVELOPE, INT8_ONNX, LEARNER, POLICY_ONNX
from sac_edge.common.manifest import files_table, write_manifest
from sac_edge.common.spec import PolicySpec
from sac_edge.train.checkpoint import inference_policy, save_tensors
from sac_edge.train.policies import Actor, CriticEnsemble, ObsNormalizer


def spec_for(env_id: str, hidden: tuple[int, ...] = (64, 64)) -> PolicySpec:
    env = gym.make(env_id)
    obs_space, act_space = env.observation_space, env.action_space
    assert isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)
    spec = PolicySpec(
        env_id=env_id,
        obs_dim=int(obs_space.shape[0]),
        act_dim=int(act_space.shape[0]),
        action_low=tuple(float(x) for x in act_space.low),
        action_high=tuple(float(x) for x in act_space.high),
        hidden=hidden,
    )
    env.close()
    return spec


def learner_tensors(spec: PolicySpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Checkpoint-style tensors of fresh networks (keys as train/checkpoint.py documents)."""
    torch.manual_seed(seed)
    actor = Actor(spec.obs_dim, spec.act_dim, spec.hidden)
    critic = CriticEnsemble(spec.obs_dim, spec.act_dim, spec.hidden)
    norm = ObsNormalizer(spec.obs_dim)
    norm.update(torch.randn(256, spec.obs_dim, dtype=torch.float64) * 2.0 + 0.5)
    tensors = {f"actor.{k}": v for k, v in actor.state_dict().items()}
    tensors.update({f"critic.{k}": v for k, v in critic.state_dict().items()})
    tensors.update({f"critic_target.{k}": v.clone() for k, v in critic.state_dict().items()})
    tensors.update({f"obs_norm.{k}": v for k, v in norm.state_dict().items()})
    tensors["log_alpha"] = torch.zeros(1)
    return tensors


def export_onnx(spec: PolicySpec, tensors: dict[str, torch.Tensor], path: Path) -> None:
    policy = inference_policy(spec, tensors)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            policy,
            (torch.zeros(1, spec.obs_dim),),
            str(path),
            dynamo=False,
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=17,
        )


def quantize_int8(src: Path, dst: Path, obs_dim: int) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.items = iter({"obs": rng.standard_normal((1, obs_dim)).astype(np.float32)} for _ in range(32))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )


def make_bundle(
    out: Path,
    env_id: str = "Pendulum-v1",
    *,
    int8: str | None = "accepted",
    seed: int = 0,
    hidden: tuple[int, ...] = (64, 64),
    envelope: bool = False,
) -> Path:
    """Write a bundle; ``int8`` is the gate verdict for the int8 graph (None: no int8 graph); ``envelope``:
    with ``envelope.json`` fitted by sac-export's code on rollouts of the policy (``export/envelope.py``)."""
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_for(env_id, hidden)
    tensors = learner_tensors(spec, seed)
    export_onnx(spec, tensors, out / POLICY_ONNX)
    save_tensors(out / LEARNER, tensors)
    if envelope:
        from sac_edge.common.atomic import atomic_write_json
        from sac_edge.export.envelope import envelope_for

        fitted = envelope_for(None, "", out / POLICY_ONNX, spec, margin=0.1, fpr=0.001, episodes=4, seed=seed)
        assert fitted is not None
        atomic_write_json(out / ENVELOPE, fitted.to_dict())
    gate: dict[str, object] | None = None
    if int8 is not None:
        quantize_int8(out / POLICY_ONNX, out / INT8_ONNX, spec.obs_dim)
        gate = {"verdict": int8, "max_action_error": 0.01 if int8 == "accepted" else 0.5}
    write_manifest(out, {"spec": spec.to_dict(), "files": files_table(out), "gate": gate, "source": {"kind": "test"}})
    return out


if __name__ == "__main__":  # the device suite's bundles: python tests/edge_runtime/bundles.py DIR
    import sys

    from conftest import PREBUILT_BUNDLES

    for name, kwargs in PREBUILT_BUNDLES.items():
        make_bundle(Path(sys.argv[1]) / name, **kwargs)
