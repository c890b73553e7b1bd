"""Stable-Baselines3 ``VecNormalize`` statistics (``--vecnormalize FILE.pkl``, as rl-zoo saves them), read
without unpickling anything.

``VecNormalize.save`` pickles the whole wrapper. The file is read as data (``pickle_data``): the globals
such a file names are only records (the wrapper, its ``RunningMeanStd``, gymnasium's ``Box``, numpy's random
generator state, numpy's array and dtype reconstructors), and the two arrays this module needs are built
from their raw bytes and declared plain dtype and shape. Any other global, an object or structured dtype,
an oversized array or a damaged stream refuses the file; nothing from it is ever imported or called.

SB3 normalises ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``: the same form as
sac-edge's ``ObsNormalizer``, so the statistics are baked into the exported graph unchanged.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from sac_edge.common.bounded import read_capped
from sac_edge.common.errors import SacEdgeError
from sac_edge.train.policies import ObsNormalizer

from .pickle_data import PickleDataError, Ref, plain_array, plain_dtype, read_pickle

_MODULES = {"numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric"}
_GLOBALS = {
    ("numpy", "dtype"): "dtype",
    ("numpy", "ndarray"): "ndarray",
    **{(m, name): name for m in _MODULES for name in ("_reconstruct", "scalar", "_frombuffer")},
    **{
        key: "record"
        for key in (
            ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"),
            ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
            ("gymnasium.spaces.box", "Box"),
            ("numpy.random._pickle", "__generator_ctor"),
            ("numpy.random._pickle", "__bit_generator_ctor"),
            ("numpy.random._pcg64", "PCG64"),
            ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
            ("numpy.random.bit_generator", "SeedSequence"),
        )
    },
}

#: The file's size and its arrays' sizes are capped before anything is allocated: the statistics of a
#: 65536-wide observation are 1 MiB, so 64 MiB is far past any real file.
MAX_FILE_BYTES = 64 << 20
MAX_ARRAY_BYTES = 64 << 20


def _dtype(value: Any) -> np.dtype[Any]:
    if not (isinstance(value, Ref) and value.kind == "dtype"):
        raise PickleDataError("an array whose dtype is not a numpy.dtype")
    return plain_dtype("numpy.dtype", value.args, value.state)


def _array(value: Any) -> np.ndarray:
    """The array a ``_reconstruct`` + BUILD (protocols 2-4) or ``_frombuffer`` (protocol 5) record
    describes."""
    if isinstance(value, Ref) and value.kind == "_reconstruct":
        state = value.state
        if not (isinstance(state, tuple) and len(state) == 5 and state[0] == 1 and isinstance(state[3], bool)):
            raise PickleDataError("an array without the state numpy writes")
        _, shape, dtype, fortran, data = state
        return plain_array(_dtype(dtype), shape, data, fortran, MAX_ARRAY_BYTES)
    if isinstance(value, Ref) and value.kind == "_frombuffer" and not value.built:
        args = value.args or ()
        if not (len(args) == 4 and args[3] in ("C", "F")):
            raise PickleDataError("an array without the arguments numpy writes")
        data, dtype, shape, order = args
        return plain_array(_dtype(dtype), shape, data, order == "F", MAX_ARRAY_BYTES)
    if isinstance(value, Ref) and value.kind == "ndarray" and value.args and len(value.args) == 2:
        shape, dtype = value.args  # numpy.ndarray(shape, dtype): no data, refused after its size is checked
        return plain_array(_dtype(dtype), shape if isinstance(shape, tuple) else (shape,), None, False, MAX_ARRAY_BYTES)
    raise PickleDataError("statistics that are not a numpy array")


def _number(value: Any, default: float) -> float:
    """A float field: a Python number, or a numpy scalar record of a plain dtype."""
    if value is None:
        return default
    if isinstance(value, Ref) and value.kind == "scalar" and value.args and len(value.args) == 2:
        return float(plain_array(_dtype(value.args[0]), (), value.args[1], False, 64)[()])
    if isinstance(value, (int, float)):
        return float(value)
    raise PickleDataError("epsilon or clip_obs is not a number")


def _fields(value: Any, what: str) -> dict[str, Any]:
    if isinstance(value, dict):  # the wrapper's fields pickled as a plain dict
        return value
    if not (isinstance(value, Ref) and value.kind == "record" and isinstance(value.state, dict)):
        raise PickleDataError(f"{what} is not a pickled object with fields")
    return value.state


class VecNormStats(NamedTuple):
    """The observation statistics of a VecNormalize file."""

    path: Path
    mean: np.ndarray  # float64 [obs_dim]
    var: np.ndarray
    epsilon: float
    clip_obs: float

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        """``VecNormalize.normalize_obs`` (float64 as SB3 computes it)."""
        scaled = (np.asarray(obs, np.float64) - self.mean) / np.sqrt(self.var + self.epsilon)
        return np.clip(scaled, -self.clip_obs, self.clip_obs)

    def normalizer(self) -> ObsNormalizer:
        """sac-edge's normaliser with these statistics (its epsilon folded into the variance)."""
        norm = ObsNormalizer(len(self.mean), clip=self.clip_obs)
        norm.mean.copy_(torch.as_tensor(self.mean, dtype=torch.float64))
        norm.var.copy_(torch.as_tensor(self.var + self.epsilon - norm.eps, dtype=torch.float64))
        return norm


def load_vecnormalize(path: Path) -> VecNormStats:
    """Read ``path`` (``VecNormalize.save``); a one-line error for anything else."""
    if not path.is_file():
        raise SacEdgeError(f"{path}: VecNormalize file not found")
    raw = read_capped(path, MAX_FILE_BYTES, "VecNormalize file", "pass the .pkl that VecNormalize.save wrote")
    try:
        fields = _fields(read_pickle(raw, _GLOBALS), "the file")
        if "obs_rms" not in fields or isinstance(fields["obs_rms"], dict):
            raise SacEdgeError(
                f"{path}: no 1-D observation statistics (obs_rms.mean/var); dict observations are not supported"
            )
        stats = _fields(fields["obs_rms"], "obs_rms")
        mean, var = _array(stats.get("mean")), _array(stats.get("var"))
        epsilon, clip_obs = _number(fields.get("epsilon"), 1e-8), _number(fields.get("clip_obs"), 10.0)
    except PickleDataError as err:
        raise SacEdgeError(
            f"{path}: not a VecNormalize file this reader accepts ({str(err)[:160]}); "
            "pass the .pkl that VecNormalize.save wrote"
        ) from None
    if not (mean.ndim == 1 and var.shape == mean.shape):
        raise SacEdgeError(
            f"{path}: no 1-D observation statistics (obs_rms.mean/var); dict observations are not supported"
        )
    if fields.get("norm_obs", True) is False:
        raise SacEdgeError(f"{path}: VecNormalize was saved with norm_obs=False; export without --vecnormalize")
    mean, var = mean.astype(np.float64), var.astype(np.float64)
    if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all() and clip_obs > 0):
        raise SacEdgeError(f"{path}: VecNormalize statistics are not finite (or a variance is negative)")
    _check_scale(path, var, epsilon)
    return VecNormStats(path, mean, var, epsilon, clip_obs)


def _check_scale(path: Path, var: np.ndarray, epsilon: float) -> None:
    """Refuse an ``epsilon`` that is not a finite number >= 0, and statistics whose scale
    ``1 / sqrt(var + epsilon)`` is 0, subnormal or infinite in the graph's float32: an infinite epsilon (or
    a variance past 1e76) maps every observation to 0, so the policy gives one action for every state and
    the parity check, which uses the same statistics, cannot see it; a zero one divides by zero."""
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise SacEdgeError(
            f"{path}: VecNormalize epsilon is {epsilon}, not a finite number >= 0 (SB3's default is 1e-8); "
            "pass the .pkl that VecNormalize.save wrote"
        )
    with np.errstate(divide="ignore", over="ignore"):
        scale = (1.0 / np.sqrt(var + epsilon)).astype(np.float32)
    bad = np.flatnonzero(~(np.isfinite(scale) & (scale >= np.finfo(np.float32).tiny)))
    if bad.size:
        at = int(bad[0])
        raise SacEdgeError(
            f"{path}: VecNormalize's var + epsilon is {var[at] + epsilon:.3g} in observation dimension {at}, so "
            f"1/sqrt(var + epsilon) is {float(scale[at]):.3g} in float32 (0 or subnormal: one action for every "
            "state; inf: a division by zero); pass the .pkl that VecNormalize.save wrote"
        )
