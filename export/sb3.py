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
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from sac_edge.common.bounded import MAX_JSON_BYTES, MAX_MEMBER_BYTES, ZIP_ERRORS, read_zip_member
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import sha256_file
from sac_edge.common.spec import MAX_DIM, PolicySpec
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
    except ZIP_ERRORS as err:
        raise SacEdgeError(
            f"{path}: corrupt or truncated Stable-Baselines3 zip ({_first_line(err)}); use the original file"
        ) from None
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


#: The most values the ``data`` entry may hold (each ``,``, ``[`` or ``{`` counted as one): SB3 writes a few
#: hundred (arrays go into base64 ``:serialized:`` strings), while 16 MiB of ``[],`` (deflated: 20 KiB) would
#: parse into 5 million lists, 400 MiB.
MAX_DATA_VALUES = 1 << 16


def _read_json(raw: bytes, path: Path) -> dict[str, Any]:
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if values > MAX_DATA_VALUES:
        raise SacEdgeError(
            f"{path}: the archive's data entry holds about {values} JSON values, more than {MAX_DATA_VALUES} "
            "(SB3 writes a few hundred); a corrupt or hostile file: use the original"
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError, JSONDecodeError, a 5,000-digit integer
        raise SacEdgeError(
            f"{path}: the archive's data entry is not JSON ({_first_line(err)}); use the original file"
        ) from None
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
    except ZIP_ERRORS:
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
    except (PickleDataError, *ZIP_ERRORS) as err:
        raise SacEdgeError(
            f"{path}: {member} is corrupt or not a plain tensor file ({_first_line(err)}); use the original file"
        ) from None


def _first_line(err: BaseException) -> str:
    """An exception's first line, short (a damaged file's own bytes may be in it)."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text[:160]


def _check_actor(state: dict[str, torch.Tensor], path: Path) -> tuple[int, ...]:
    """The actor's hidden widths; refuse what the mapping cannot represent (gSDE, non-MLP extractors) and a
    state dict that is not SB3's SAC MlpPolicy of consistent shapes (``_check_networks``)."""
    if "actor.log_std.weight" not in state or "actor.mu.weight" not in state:
        kind = "a gSDE policy (use_sde=True)" if "actor.log_std" in state else "not an SB3 SAC MlpPolicy"
        raise SacEdgeError(f"{path}: {kind}; only the default squashed-Gaussian SAC MlpPolicy can be exported")
    if "actor.latent_pi.0.weight" not in state or any(k.startswith("actor.features_extractor.") for k in state):
        raise SacEdgeError(f"{path}: actor is not a plain MLP (no latent_pi layers or a learned feature extractor)")
    return _check_networks(state, path)


def _check_networks(state: dict[str, torch.Tensor], path: Path) -> tuple[int, ...]:
    """The actor's hidden widths, after checking that ``state`` is exactly the tensors of SB3's SAC
    MlpPolicy: Linear stacks whose shapes chain (actor ``latent_pi`` -> ``mu``/``log_std``; 1 to 16 critics
    and their targets, of one shape, from observation + action to one Q-value), nothing else, floating point
    and finite. A damaged file is one line here, not a shape error deep in torch or SB3."""
    first = state["actor.latent_pi.0.weight"]
    obs_dim = int(first.shape[1]) if first.ndim == 2 else 0
    hidden = _mlp(state, "actor.latent_pi", obs_dim, path)
    act_dim = int(state["actor.mu.weight"].shape[0]) if state["actor.mu.weight"].ndim == 2 else 0
    for head in ("actor.mu", "actor.log_std"):
        _linear(state, f"{head}.weight", f"{head}.bias", hidden[-1], act_dim, path)
    known = {f"actor.{head}.{p}" for head in ("mu", "log_std") for p in ("weight", "bias")}
    known |= {f"actor.latent_pi.{2 * i}.{p}" for i in range(len(hidden)) for p in ("weight", "bias")}
    widths: dict[str, list[int]] = {}
    for prefix in ("critic", "critic_target"):
        for q in range(MAX_CRITICS):
            if f"{prefix}.qf{q}.0.weight" not in state:
                break
            widths[f"{prefix}.qf{q}"] = _mlp(state, f"{prefix}.qf{q}", obs_dim + act_dim, path)
            layers = len(widths[f"{prefix}.qf{q}"])
            known |= {f"{prefix}.qf{q}.{2 * i}.{p}" for i in range(layers) for p in ("weight", "bias")}
    shapes = {tuple(w) for w in widths.values()}
    if "critic.qf0" not in widths or len(shapes) != 1 or next(iter(shapes))[-1] != 1:
        raise SacEdgeError(
            f"{path}: policy.pth's critics are missing or of different shapes (widths {str(widths)[:120]}); "
            "an SB3 SAC policy has critics and target critics of one shape ending in one Q-value"
        )
    if len(widths) != 2 * sum(1 for name in widths if name.startswith("critic.")):
        raise SacEdgeError(f"{path}: policy.pth's critic and critic_target hold different numbers of Q-networks")
    _check_values(state, known, path)
    return tuple(hidden)


#: The most Q-networks an SB3 critic may hold (SB3's default is 2).
MAX_CRITICS = 16


def _mlp(state: dict[str, torch.Tensor], prefix: str, n_in: int, path: Path) -> list[int]:
    """The widths of the Linear stack ``prefix.0``, ``prefix.2``, ... (SB3's ``create_mlp``: a ReLU between),
    each layer taking the previous one's width, the first ``n_in``."""
    widths: list[int] = []
    while f"{prefix}.{2 * len(widths)}.weight" in state:
        at = f"{prefix}.{2 * len(widths)}"
        weight = state[f"{at}.weight"]
        out = int(weight.shape[0]) if weight.ndim == 2 else 0
        _linear(state, f"{at}.weight", f"{at}.bias", n_in, out, path)
        widths.append(out)
        n_in = out
    return widths


def _linear(state: dict[str, torch.Tensor], weight: str, bias: str, n_in: int, n_out: int, path: Path) -> None:
    """Refuse (one line) a Linear layer that is not ``weight [n_out, n_in]`` and ``bias [n_out]``, each size
    from 1 to ``MAX_DIM`` (buffers downstream are sized from them)."""
    w, b = state.get(weight), state.get(bias)
    shown = (tuple(w.shape) if w is not None else None, tuple(b.shape) if b is not None else None)
    if not (0 < n_in <= MAX_DIM and 0 < n_out <= MAX_DIM and shown == ((n_out, n_in), (n_out,))):
        raise SacEdgeError(
            f"{path}: policy.pth's {weight.rsplit('.', 1)[0]} has weight and bias of shapes {shown}, not a Linear "
            f"layer from the previous width ({n_in}) of at most {MAX_DIM}; a corrupt file or not an SB3 SAC MlpPolicy"
        )


def _check_values(state: dict[str, torch.Tensor], known: set[str], path: Path) -> None:
    """Only the tensors SB3's SAC MlpPolicy has, each floating point and finite (NaN weights export a graph
    that acts, and critics that make on-device fine-tuning discard every update)."""
    extra = sorted(set(state) - known)
    if extra:
        raise SacEdgeError(
            f"{path}: policy.pth holds {extra[0][:80]!r}, which SB3's SAC MlpPolicy has not; a corrupt file or "
            "another policy class"
        )
    for name, tensor in state.items():  # finite as the float32 the graph and the learner compute in
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor.float()).all()):
            floating = tensor.is_floating_point()
            what = "holds NaN or values infinite in float32" if floating else "is not floating point"
            raise SacEdgeError(
                f"{path}: policy.pth's {name} {what}; the model diverged or the file is corrupt: export an earlier "
                "checkpoint"
            )


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
    inverted = np.isnan(low) | np.isnan(high) | (low >= high if need_bounds else low > high)
    if inverted.any():
        raise SacEdgeError(
            f"{path}: the recorded {key} has its low bound above its high bound (or NaN) in dimensions "
            f"{np.flatnonzero(inverted).tolist()}; a corrupt file: pass --env ID"
        )
    with np.errstate(over="ignore"):  # the graph computes in float32: a bound or a range past it is inf there
        low, high = low.astype(np.float32).astype(np.float64), high.astype(np.float32).astype(np.float64)
        span = high.astype(np.float32) - low.astype(np.float32)
    bounded = np.isfinite(low) & np.isfinite(high) & np.isfinite(span)
    if below is not None and above is not None:
        bounded &= below & above
    if need_bounds and not bounded.all():
        raise SacEdgeError(
            f"{path}: the recorded {key} is unbounded in dimensions {np.flatnonzero(~bounded).tolist()} (or its "
            "range overflows float32); a SAC policy needs finite action bounds"
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
    """Indices of the Linear layers under ``prefix.`` (``prefix.0``, ``prefix.2``, ...; ``_mlp`` checked them)."""
    layers = 0
    while f"{prefix}.{2 * layers}.weight" in state:
        layers += 1
    return [2 * i for i in range(layers)]


def _critic_tensors(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """SB3's separate ``qf0``/``qf1``/... Linear stacks -> the fused ensemble's ``weights.j [n, in, out]``."""
    n_critics = sum(1 for q in range(MAX_CRITICS) if f"{prefix}.qf{q}.0.weight" in state)
    out: dict[str, torch.Tensor] = {}
    for j, layer in enumerate(_linear_layers(state, f"{prefix}.qf0")):
        ws = [state[f"{prefix}.qf{q}.{layer}.weight"].t() for q in range(n_critics)]
        bs = [state[f"{prefix}.qf{q}.{layer}.bias"][None, :] for q in range(n_critics)]
        out[f"{prefix}.weights.{j}"] = torch.stack(ws).contiguous()
        out[f"{prefix}.biases.{j}"] = torch.stack(bs).contiguous()
    return out


def _log_alpha(data: dict[str, Any], variables: dict[str, torch.Tensor], path: Path) -> torch.Tensor:
    """``log_ent_coef`` when alpha was learned, else ``log(ent_coef)`` from the plain JSON field; finite in
    float32 either way (a NaN alpha exports cleanly, then on-device fine-tuning rejects every update)."""
    if "log_ent_coef" in variables:
        value = variables["log_ent_coef"]
        if value.numel() != 1 or not value.is_floating_point():
            raise SacEdgeError(f"{path}: pytorch_variables.pth's log_ent_coef is not one number; a corrupt file")
        log_alpha, shown = value.detach().reshape(1).float(), f"log_ent_coef {float(value.reshape(-1)[0])}"
    else:
        raw = data.get("ent_coef")
        try:
            coef = float(raw) if isinstance(raw, (int, float, str)) and not isinstance(raw, bool) else math.nan
        except (ValueError, OverflowError):
            coef = math.nan
        if not math.isfinite(coef) or coef <= 0:
            raise SacEdgeError(
                f"{path}: no entropy coefficient (log_ent_coef, or ent_coef as a positive finite number: the zip "
                f"has {str(raw)[:40]!r})"
            )
        log_alpha, shown = torch.tensor([math.log(coef)], dtype=torch.float32), f"ent_coef {coef}"
    if not bool(torch.isfinite(log_alpha).all()):
        raise SacEdgeError(f"{path}: the entropy coefficient ({shown[:60]}) is not finite; a corrupt file")
    return log_alpha


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
