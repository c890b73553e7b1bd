"""Stable-Baselines3 ``VecNormalize`` statistics (``--vecnormalize FILE.pkl``, as rl-zoo saves them), read
without executing pickled code.

``VecNormalize.save`` pickles the whole wrapper. A restricted unpickler rebuilds only numpy arrays, dtypes
and scalars (numpy's own reconstructors); the few classes such a file names (the wrapper, its
``RunningMeanStd``, gymnasium's ``Box``, numpy's random generator state) become inert records of their
pickled fields, and any other global refuses the file. Nothing from the file is ever called or imported.

SB3 normalises ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``: the same form as
sac-edge's ``ObsNormalizer``, so the statistics are baked into the exported graph unchanged.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from sac_edge.common.bounded import read_capped
from sac_edge.common.errors import SacEdgeError
from sac_edge.train.policies import ObsNormalizer

_NUMPY = {
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    *((m, name) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for name in ("_reconstruct", "scalar")),
}
_RECORDS = {
    ("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize"),
    ("stable_baselines3.common.running_mean_std", "RunningMeanStd"),
    ("gymnasium.spaces.box", "Box"),
    ("numpy.random._pickle", "__generator_ctor"),
    ("numpy.random._pickle", "__bit_generator_ctor"),
    ("numpy.random._pcg64", "PCG64"),
    ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    ("numpy.random.bit_generator", "SeedSequence"),
}


class _Record:
    """An inert stand-in for a pickled object: keeps its constructor arguments and state, runs nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.state = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


#: The file's size and its arrays' sizes are capped before anything is allocated: the statistics of a
#: 65536-wide observation are 1 MiB, so 64 MiB is far past any real file.
MAX_FILE_BYTES = 64 << 20
MAX_ARRAY_BYTES = 64 << 20


def _checked_size(shape: Any, dtype: Any) -> None:
    """Refuse an array of ``shape`` x ``dtype`` bigger than MAX_ARRAY_BYTES, before numpy allocates it."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        raise pickle.UnpicklingError("array shape is not a tuple of sizes")
    count = 1
    for d in dims:
        count *= d
    if count * np.dtype(dtype).itemsize > MAX_ARRAY_BYTES:
        raise pickle.UnpicklingError(f"an array of shape {str(dims)[:40]} is larger than {MAX_ARRAY_BYTES >> 20} MiB")


class _Ndarray:
    """``numpy.ndarray`` as the pickle names it: built only after its size is checked."""

    def __new__(cls, shape: Any, dtype: Any = float, *args: Any, **kwargs: Any) -> Any:
        _checked_size(shape, dtype)
        return np.ndarray(shape, dtype, *args, **kwargs)


def _guarded_reconstruct(reconstruct: Any) -> Any:
    """numpy's ``_reconstruct`` with the size check (the data come in ``__setstate__``, whose length numpy
    checks against the shape, so they are bounded by the file)."""

    def build(subtype: Any, shape: Any, dtype: Any) -> Any:
        _checked_size(shape, np.uint8 if isinstance(dtype, bytes) else dtype)
        return reconstruct(np.ndarray if subtype is _Ndarray else subtype, shape, dtype)

    return build


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("numpy", "ndarray"):
            return _Ndarray
        if name == "_reconstruct" and (module, name) in _NUMPY:
            return _guarded_reconstruct(super().find_class(module, name))
        if (module, name) in _NUMPY:
            return super().find_class(module, name)
        if (module, name) in _RECORDS:
            return type(name, (_Record,), {})
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


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
        top = _RestrictedUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as err:
        raise SacEdgeError(
            f"{path}: not a VecNormalize file this reader accepts ({str(err).splitlines()[0][:160]}); "
            "pass the .pkl that VecNormalize.save wrote"
        ) from None
    fields = top.state if isinstance(top, _Record) and isinstance(top.state, dict) else {}
    rms = fields.get("obs_rms")
    stats = rms.state if isinstance(rms, _Record) and isinstance(rms.state, dict) else {}
    mean, var = stats.get("mean"), stats.get("var")
    if not (
        isinstance(mean, np.ndarray) and isinstance(var, np.ndarray) and mean.ndim == 1 and var.shape == mean.shape
    ):
        raise SacEdgeError(
            f"{path}: no 1-D observation statistics (obs_rms.mean/var); dict observations are not supported"
        )
    if not fields.get("norm_obs", True):
        raise SacEdgeError(f"{path}: VecNormalize was saved with norm_obs=False; export without --vecnormalize")
    try:
        epsilon, clip_obs = float(fields.get("epsilon", 1e-8)), float(fields.get("clip_obs", 10.0))
    except (TypeError, ValueError):
        raise SacEdgeError(f"{path}: epsilon or clip_obs is not a number") from None
    mean, var = mean.astype(np.float64), var.astype(np.float64)
    if not (np.isfinite(mean).all() and np.isfinite(var).all() and (var >= 0).all() and clip_obs > 0):
        raise SacEdgeError(f"{path}: VecNormalize statistics are not finite (or a variance is negative)")
    return VecNormStats(path, mean, var, epsilon, clip_obs)
