"""The run dir's files and how they are read back: safetensors + JSON, never pickle.

Tensor keys in ``checkpoint.safetensors`` (the contract export and the fine-tuner read):
``actor.<param>``, ``critic.<param>``, ``critic_target.<param>``, ``log_alpha``, ``obs_norm.{mean,var,count}``,
``optim.<name>.<index>.<slot>`` and ``rng.torch``. ``trainer_state.json`` holds the counters, the numpy
and environment RNG states and the optimiser hyperparameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from sac_edge.common.atomic import atomic_path
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.jsonfile import read_json
from sac_edge.common.manifest import sha256_file
from sac_edge.common.spec import PolicySpec

from .policies import Actor, CriticEnsemble, InferencePolicy, ObsNormalizer

CONFIG = "config.json"
CHECKPOINT = "checkpoint.safetensors"
TRAINER_STATE = "trainer_state.json"
CALIB_STATES = "calib_states.npy"
METRICS = "metrics.csv"

LEARNER_PREFIXES = ("actor.", "critic.", "log_alpha", "obs_norm.")
RESUME_ONLY_PREFIXES = ("replay.", "optim.", "rng.")


class Run(NamedTuple):
    """A trained run read back from disk (validated)."""

    path: Path
    config: dict[str, Any]
    spec: PolicySpec
    tensors: dict[str, torch.Tensor]
    checkpoint_sha256: str


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (contiguous CPU copies; shared storage is not allowed)."""
    flat = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(flat, str(tmp), metadata=metadata)


def read_checkpoint(
    path: Path, what: str = "checkpoint", skip: tuple[str, ...] = ()
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A safetensors file's tensors (except keys starting with one of ``skip``, never read from disk) and its
    metadata, in one pass; a missing, truncated or corrupt file is a one-line SacEdgeError."""
    if not path.is_file():
        raise SacEdgeError(f"{path}: {what} not found (train with sac-train first)")
    try:
        with safe_open(str(path), framework="pt") as fh:
            tensors = {k: fh.get_tensor(k) for k in fh.keys() if not k.startswith(skip)}  # noqa: SIM118 (not a dict)
            return tensors, fh.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise SacEdgeError(f"{path}: {what} is corrupt or truncated ({err}); use an intact copy") from None


def load_tensors(path: Path, what: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (see ``read_checkpoint``)."""
    return read_checkpoint(path, what)[0]


def prefixed(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The sub-dict under ``prefix.`` with the prefix removed (a module's state dict)."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in tensors.items() if k.startswith(prefix + ".")}


def load_run(run_dir: str | Path) -> Run:
    """Read and validate a run dir written by ``sac-train``."""
    path = Path(run_dir)
    if not path.is_dir():
        raise SacEdgeError(f"{path}: run dir not found")
    config = read_json(path / CONFIG, "run config", "train the run with sac-train first")
    spec = PolicySpec.from_dict(config.get("spec", {}), source=str(path / CONFIG))
    # The policy and learner only: the replay rows and optimiser slots (most of the file) stay on disk.
    tensors, _ = read_checkpoint(path / CHECKPOINT, skip=RESUME_ONLY_PREFIXES)
    missing = [k for k in ("log_alpha", "obs_norm.mean", "actor.mu.weight") if k not in tensors]
    if missing:
        raise SacEdgeError(f"{path / CHECKPOINT}: not a sac-edge checkpoint (missing {', '.join(missing)})")
    mu = tensors["actor.mu.weight"]
    first = tensors.get("actor.trunk.0.weight")
    if mu.shape[0] != spec.act_dim or first is None or first.shape[1] != spec.obs_dim:
        raise SacEdgeError(
            f"{path}: checkpoint shapes do not match config.json (obs_dim={spec.obs_dim}, "
            f"act_dim={spec.act_dim}); the run dir is inconsistent, retrain or restore it"
        )
    return Run(path, config, spec, tensors, sha256_file(path / CHECKPOINT))


def build_actor(spec: PolicySpec, tensors: dict[str, torch.Tensor]) -> Actor:
    actor = Actor(spec.obs_dim, spec.act_dim, spec.hidden)
    actor.load_state_dict(prefixed(tensors, "actor"))
    return actor


def build_normalizer(spec: PolicySpec, tensors: dict[str, torch.Tensor]) -> ObsNormalizer:
    norm = ObsNormalizer(spec.obs_dim)
    norm.load_state_dict(prefixed(tensors, "obs_norm"))
    return norm


def build_critic(spec: PolicySpec, tensors: dict[str, torch.Tensor], prefix: str = "critic") -> CriticEnsemble:
    state = prefixed(tensors, prefix)
    n_layers = sum(1 for k in state if k.startswith("weights."))
    n_critics, _, width = state["weights.0"].shape
    critic = CriticEnsemble(spec.obs_dim, spec.act_dim, (width,) * (n_layers - 1), n_critics)
    critic.load_state_dict(state)
    return critic


def inference_policy(spec: PolicySpec, tensors: dict[str, torch.Tensor]) -> InferencePolicy:
    """The deterministic deployment policy (raw obs -> env-unit action) from checkpoint tensors."""
    policy = InferencePolicy(
        build_actor(spec, tensors),
        build_normalizer(spec, tensors),
        torch.tensor(spec.action_low),
        torch.tensor(spec.action_high),
    )
    return policy.eval()


def learner_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What on-device fine-tuning needs: actor, critics, target critics, log-alpha, normaliser."""
    return {k: v for k, v in tensors.items() if k.startswith(LEARNER_PREFIXES) or k.startswith("critic_target.")}
