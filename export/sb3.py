"""A Stable-Baselines3 SAC ``.zip`` read without unpickling anything, mapped onto sac-edge's networks.

The archive (SB3 ``save_to_zip_file``) holds ``policy.pth`` (the policy's state dict, a plain tensor
``torch.save``), ``pytorch_variables.pth`` (``log_ent_coef``) and ``data``: JSON in which objects that
are not plain JSON are cloudpickled under a ``:serialized:`` key. Only the tensor files (read as data by
``torch_data``, never unpickled) and plain JSON fields are used; ``:serialized:`` payloads are ignored.
The observation and action spaces come from the Box fields SB3 writes beside each pickled space
(``_shape``, ``low``, ``high``, ``bounded_below``, ``bounded_above``, numpy's str of each array), so no
environment is needed; ``--env``, when given, must agree with them.

SB3's MlpPolicy actor is ``latent_pi`` (Linear+ReLU, default net_arch [256, 256]) -> ``mu`` / ``log_std``;
its deterministic action is ``tanh(mu)`` scaled to the bounds by ``policy.unscale_action``
(``low + 0.5 (a + 1) (high - low)``), and it has no observation normaliser (identity, no clamp) unless
``VecNormalize`` statistics are given (``vecnormalize.py``).
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from sac_edge.common.bounded import MAX_JSON_BYTES, MAX_MEMBER_BYTES, read_zip_member
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import sha256_file
from sac_edge.common.spec import PolicySpec
from sac_edge.train.policies import ObsNormalizer

from .pickle_data import PickleDataError
from .torch_data import load_state_dict
from .vecnormalize import VecNormStats


class Box(NamedTuple):
    """A Box space as the zip records it in plain JSON fields: shape and float64 bounds (inf: unbounded)."""

    shape: tuple[int, ...]
    low: np.ndarray
    high: np.ndarray


class Sb3Model(NamedTuple):
    """An SB3 SAC policy as sac-edge checkpoint tensors (``actor.*``, ``critic.*``, ``log_alpha``, ...)."""

    path: Path
    spec: PolicySpec
    tensors: dict[str, torch.Tensor]
    sb3_state: dict[str, torch.Tensor]  # SB3's own state dict, for the parity reference
    sha256: str
    sb3_version: str
    observation_space: Box  # as recorded in the zip (bounds may be infinite)
    obs_norm: VecNormStats | None  # VecNormalize statistics baked into the graph (--vecnormalize)


class Sb3Archive(NamedTuple):
    """The members of an SB3 zip that the export reads (never the ``:serialized:`` payloads)."""

    data: dict[str, Any]
    state: dict[str, torch.Tensor]
    variables: dict[str, torch.Tensor]
    version: str


def is_sb3_zip(path: Path) -> bool:
    return path.suffix == ".zip"


def read_sb3_zip(path: Path) -> Sb3Archive:
    """The ``data`` JSON, ``policy.pth``, ``pytorch_variables.pth`` and the version of an SB3 zip."""
    if not path.is_file():
        raise SacEdgeError(f"{path}: Stable-Baselines3 zip not found")
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
            if "policy.pth" not in names or "data" not in names:
                raise SacEdgeError(f"{path}: not a Stable-Baselines3 model (no policy.pth/data in the archive)")

            def member(name: str, cap: int = MAX_MEMBER_BYTES) -> bytes:  # every read is size-capped
                return read_zip_member(archive, name, cap, path)

            data = _read_json(member("data", MAX_JSON_BYTES), path)
            state = _read_tensors(member("policy.pth"), path, "policy.pth")
            variables = (
                _read_tensors(member("pytorch_variables.pth"), path, "pytorch_variables.pth")
                if "pytorch_variables.pth" in names
                else {}
            )
            version = (
                member("_stable_baselines3_version", 1024).decode(errors="replace").strip()
                if ("_stable_baselines3_version" in names)
                else "unknown"
            )
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, KeyError) as err:
        raise SacEdgeError(f"{path}: corrupt or truncated Stable-Baselines3 zip ({err})") from None
    return Sb3Archive(data, state, variables, version)


def load_sb3_zip(
    path: Path, env_id: str = "", env_box: tuple[Box, Box] | None = None, obs_norm: VecNormStats | None = None
) -> Sb3Model:
    """Read ``path``; its spaces come from the zip's plain ``data`` fields, checked against the weights, and
    against ``env_box`` (the ``--env``'s observation and action spaces) when given."""
    archive = read_sb3_zip(path)
    state = archive.state
    hidden = _check_actor(state, path)
    obs_dim, act_dim = int(state["actor.latent_pi.0.weight"].shape[1]), int(state["actor.mu.weight"].shape[0])
    obs_box = recorded_box(archive.data, "observation_space", path, obs_dim, need_bounds=False)
    act_box = recorded_box(archive.data, "action_space", path, act_dim, need_bounds=True)
    if env_box is not None:
        _check_env_spaces(path, env_id, obs_box, act_box, *env_box)
        obs_box = env_box[0]
    if obs_norm is not None and obs_norm.mean.shape != (obs_dim,):
        raise SacEdgeError(
            f"{obs_norm.path}: VecNormalize statistics have shape {obs_norm.mean.shape}, the policy takes "
            f"{obs_dim} observations; pass the statistics saved with this model"
        )
    spec = PolicySpec(
        env_id=env_id,
        obs_dim=obs_dim,
        act_dim=act_dim,
        action_low=tuple(float(x) for x in act_box.low),
        action_high=tuple(float(x) for x in act_box.high),
        hidden=hidden,
    )
    normalizer = _identity_normalizer(obs_dim) if obs_norm is None else obs_norm.normalizer()
    try:
        tensors = {
            **_actor_tensors(state, len(hidden)),
            **_critic_tensors(state, "critic"),
            **_critic_tensors(state, "critic_target"),
            "log_alpha": _log_alpha(archive.data, archive.variables, path),
            **{f"obs_norm.{k}": v for k, v in normalizer.state_dict().items()},
        }
    except KeyError as err:
        raise SacEdgeError(f"{path}: policy.pth lacks {err}; not a complete SB3 SAC policy") from None
    return Sb3Model(path, spec, tensors, state, sha256_file(path), archive.version, obs_box, obs_norm)


def _read_json(raw: bytes, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise SacEdgeError(f"{path}: the archive's data entry is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise SacEdgeError(f"{path}: the archive's data entry is not a JSON object")
    return data


def _check_records(raw: bytes, path: Path, member: str) -> None:
    """Refuse (one line) a tensor file that would inflate in ``torch.load``: ``torch.save`` writes a zip
    whose records are stored, never compressed, so a compressed record (a few KiB deflating to GiBs) or one
    declaring more bytes than the file holds is not one it wrote. The legacy non-zip format, whose storage
    sizes are allocated as declared before they are read, is refused too."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as inner:
            records = inner.infolist()
    except zipfile.BadZipFile:
        raise SacEdgeError(
            f"{path}: {member} is not in torch's zip format (torch.save since 1.6); save the model with a current SB3"
        ) from None
    for info in records:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size > len(raw):
            raise SacEdgeError(
                f"{path}: {member} record {info.filename[:60]!r} is compressed to inflate to {info.file_size} bytes; "
                "torch.save never compresses (a corrupt or hostile file): use the original file"
            )


def _read_tensors(raw: bytes, path: Path, member: str) -> dict[str, torch.Tensor]:
    """The state dict in a ``torch.save`` file, read as data (``torch_data``: no unpickling, not even
    ``torch.load(weights_only=True)``'s restricted unpickler), after the records' sizes are checked
    (``_check_records``)."""
    _check_records(raw, path, member)
    try:
        return load_state_dict(raw)
    except (PickleDataError, zipfile.BadZipFile, KeyError, RuntimeError) as err:
        raise SacEdgeError(
            f"{path}: {member} is corrupt or not a plain tensor file ({str(err).splitlines()[0][:160]})"
        ) from None


def _check_actor(state: dict[str, torch.Tensor], path: Path) -> tuple[int, ...]:
    """The actor's hidden widths; refuse what the mapping cannot represent (gSDE, non-MLP extractors)."""
    if "actor.log_std.weight" not in state or "actor.mu.weight" not in state:
        kind = "a gSDE policy (use_sde=True)" if "actor.log_std" in state else "not an SB3 SAC MlpPolicy"
        raise SacEdgeError(f"{path}: {kind}; only the default squashed-Gaussian SAC MlpPolicy can be exported")
    hidden: list[int] = []
    while f"actor.latent_pi.{2 * len(hidden)}.weight" in state:
        hidden.append(int(state[f"actor.latent_pi.{2 * len(hidden)}.weight"].shape[0]))
    if not hidden or any(k.startswith("actor.features_extractor.") for k in state):
        raise SacEdgeError(f"{path}: actor is not a plain MLP (no latent_pi layers or a learned feature extractor)")
    return tuple(hidden)


def _parse_numpy_repr(text: Any, size: int, kind: type) -> np.ndarray | None:
    """numpy's str of a 1-D array as SB3 writes Box fields (``'[-1. -1. -8.]'``, ``'[ True False]'``) ->
    array of ``size`` values; None when absent, abridged (``...``) or of another length."""
    if not isinstance(text, str) or "..." in text:
        return None
    words = text.replace("[", " ").replace("]", " ").split()
    try:
        values: list[Any] = [word == "True" for word in words] if kind is bool else [float(w) for w in words]
    except ValueError:
        return None
    return np.array(values, dtype=kind if kind is bool else np.float64) if len(values) == size else None


def recorded_box(data: dict[str, Any], key: str, path: Path, dim: int, *, need_bounds: bool) -> Box:
    """The ``key`` space from the zip's plain fields, checked against the weights' size ``dim``.

    ``need_bounds``: refuse a space whose bounds are missing, abridged in numpy's repr, or not finite on
    both sides (the action space: the graph scales the squashed action into them).
    """
    space = data.get(key)
    shape = space.get("_shape") if isinstance(space, dict) else None
    if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape):
        raise SacEdgeError(
            f"{path}: the zip records no {key} shape (data['{key}']['_shape']); re-save it with "
            "Stable-Baselines3 >= 2.0 or pass --env ID"
        )
    if shape != [dim]:
        raise SacEdgeError(f"{path}: recorded {key} shape {shape} does not match the weights ({dim})")
    assert isinstance(space, dict)
    low, high = (_parse_numpy_repr(space.get(name), dim, float) for name in ("low", "high"))
    below, above = (_parse_numpy_repr(space.get(name), dim, bool) for name in ("bounded_below", "bounded_above"))
    if low is None or high is None:
        if need_bounds:
            raise SacEdgeError(f"{path}: the zip's {key} bounds are missing or abridged in numpy's repr; pass --env ID")
        low, high = np.full(dim, -np.inf), np.full(dim, np.inf)
    bounded = np.isfinite(low) & np.isfinite(high)
    if below is not None and above is not None:
        bounded &= below & above
    if need_bounds and not bounded.all():
        raise SacEdgeError(
            f"{path}: the recorded {key} is unbounded in dimensions {np.flatnonzero(~bounded).tolist()}; "
            "a SAC policy needs finite action bounds"
        )
    return Box((dim,), np.where(bounded, low, -np.inf), np.where(bounded, high, np.inf))


def _check_env_spaces(path: Path, env_id: str, obs: Box, act: Box, env_obs: Box, env_act: Box) -> None:
    """The zip's recorded spaces and the ``--env``'s must agree."""
    if env_obs.shape != obs.shape or env_act.shape != act.shape:
        raise SacEdgeError(
            f"{path}: policy has obs_dim={obs.shape[0]}, act_dim={act.shape[0]} but {env_id} has observation "
            f"shape {env_obs.shape} and action shape {env_act.shape}; pass the --env it was trained on"
        )
    for name, recorded, bound in (("low", act.low, env_act.low), ("high", act.high, env_act.high)):
        if not np.allclose(recorded, bound):
            raise SacEdgeError(
                f"{path}: recorded action {name} {recorded.tolist()} differs from {env_id}'s {bound.tolist()}"
            )


def _actor_tensors(state: dict[str, torch.Tensor], n_hidden: int) -> dict[str, torch.Tensor]:
    out = {
        f"actor.trunk.{2 * i}.{p}": state[f"actor.latent_pi.{2 * i}.{p}"]
        for i in range(n_hidden)
        for p in ("weight", "bias")
    }
    for head in ("mu", "log_std"):
        for p in ("weight", "bias"):
            out[f"actor.{head}.{p}"] = state[f"actor.{head}.{p}"]
    return out


def _linear_layers(state: dict[str, torch.Tensor], prefix: str) -> list[int]:
    """Indices of the Linear layers under ``prefix.`` (``prefix.<i>.weight``), in numeric order."""
    cut = len(prefix) + 1
    return sorted(int(k[cut:].split(".")[0]) for k in state if k.startswith(prefix + ".") and k.endswith(".weight"))


def _critic_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """SB3's separate ``qf0``/``qf1``/... Linear stacks -> the fused ensemble's ``weights.j [n, in, out]``."""
    n_critics = sum(1 for q in range(16) if f"{prefix}.qf{q}.0.weight" in state)
    if n_critics == 0:
        raise SacEdgeError(f"policy.pth has no {prefix} weights; not an SB3 SAC policy")
    out: dict[str, torch.Tensor] = {}
    for j, layer in enumerate(_linear_layers(state, f"{prefix}.qf0")):
        ws = [state[f"{prefix}.qf{q}.{layer}.weight"].t() for q in range(n_critics)]
        bs = [state[f"{prefix}.qf{q}.{layer}.bias"][None, :] for q in range(n_critics)]
        out[f"{prefix}.weights.{j}"] = torch.stack(ws).contiguous()
        out[f"{prefix}.biases.{j}"] = torch.stack(bs).contiguous()
    return out


def _log_alpha(data: dict[str, Any], variables: dict[str, torch.Tensor], path: Path) -> torch.Tensor:
    """``log_ent_coef`` when alpha was learned, else ``log(ent_coef)`` from the plain JSON field."""
    if "log_ent_coef" in variables:
        return variables["log_ent_coef"].detach().reshape(1).float()
    try:
        return torch.tensor([math.log(float(data["ent_coef"]))], dtype=torch.float32)
    except (KeyError, TypeError, ValueError):
        raise SacEdgeError(f"{path}: no entropy coefficient (log_ent_coef or a numeric ent_coef)") from None


def _identity_normalizer(obs_dim: int) -> ObsNormalizer:
    """SB3 feeds raw observations: zero mean, unit scale (var + eps rounds to 1.0 in float32), no clip."""
    norm = ObsNormalizer(obs_dim, clip=math.inf)
    norm.var.fill_(1.0 - norm.eps)
    return norm


def sb3_reference(model: Sb3Model) -> Callable[[np.ndarray], np.ndarray] | None:
    """SB3's own ``predict(obs, deterministic=True)`` on the zip's weights (on ``VecNormalize``-normalised
    observations with ``--vecnormalize``), or None without stable-baselines3.

    The SB3 policy is built from the recorded spaces and loaded with the state dict (never ``SAC.load``,
    which unpickles the ``data`` objects).
    """
    try:
        import gymnasium as gym
        from stable_baselines3.sac.policies import SACPolicy
    except ImportError:
        return None
    spec, box = model.spec, model.observation_space
    obs_space = gym.spaces.Box(box.low.astype(np.float32), box.high.astype(np.float32), dtype=np.float32)
    act_space = gym.spaces.Box(
        np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32), dtype=np.float32
    )
    qf_arch = [
        int(model.sb3_state[f"critic.qf0.{i}.weight"].shape[0]) for i in _linear_layers(model.sb3_state, "critic.qf0")
    ]
    policy = SACPolicy(obs_space, act_space, lambda _: 3e-4, net_arch={"pi": list(spec.hidden), "qf": qf_arch[:-1]})
    policy.load_state_dict(model.sb3_state)
    policy.set_training_mode(False)
    norm = model.obs_norm

    def predict(obs: np.ndarray) -> np.ndarray:
        inputs = obs if norm is None else norm.normalize(obs).astype(np.float32)
        action, _ = policy.predict(inputs, deterministic=True)
        return np.asarray(action, dtype=np.float32)

    return predict
