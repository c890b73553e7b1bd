"""Safety of fine-tuning: judge a candidate before and after it serves, and keep the last good weights on disk.

Before serving, the shadow check runs the candidate and the last good policy on recent states: every
action finite and inside the bounds, and the mean action difference at most ``shadow_max_diff`` of the
action range (a candidate that suddenly acts very differently is not put on the plant). After serving,
the mean return of ``window`` episodes served entirely by the candidate is compared with the mean of the
last ``window`` episodes served by the last good weights, on the same (possibly shifted) plant. It rolls
back when the drop is both *large* (more than ``rollback_threshold`` x ``max(|good mean|, 1)``) and *real*
(more than ``noise_z`` standard errors of the difference of the two means): episode returns of one policy
spread widely with the start state (Pendulum, g=13, fine-tuned: a standard deviation of ~110 around ~-170,
so two 8-episode means differ with a standard error of ~55), so a 25% threshold (~42) alone would roll back
about one equally good candidate in five, each time throwing away the learning since the last promotion.
A planted or real regression (a drop of several hundred) clears both bars; otherwise the candidate becomes
the last good.

The last good weights live in ``DIR/last_good.safetensors`` (learner tensors + the recent states they were
checked on, with the step, returns and generation in the safetensors metadata, so the one file is
self-describing) and ``DIR/last_good.json`` (the same facts plus the file's sha256, for people and for
``--resume``'s check). Both are written atomically (temp file, fsync, rename), the tensors first: a crash or
power loss at any moment leaves either the old pair or the new tensors, never a torn file. The tensors
file carries a checksum of its own tensors in its metadata, and the pair it replaces is kept as
``DIR/previous.safetensors`` / ``DIR/previous.json``: ``load`` refuses a set whose checksum does not match or
that holds non-finite, absurd or non-floating weights, naming the previous generation to fall back to.
Every file here is read as a regular file of bounded size, never through a symlink, and the tensors are
parsed from the very bytes whose checksum is checked. This module has no torch import, so ``sac-edge run
--resume`` without ``--finetune`` stays torch-free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.atomic import atomic_path, atomic_write_json
from sac_edge.common.bounded import open_regular, read_capped
from sac_edge.common.bundle_format import LAST_GOOD, LAST_GOOD_INFO, LOCK, PREVIOUS, PREVIOUS_INFO
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.jsonfile import read_json_or_none

STATES_KEY = "shadow_states"
INFO_KEY = "sac_edge_last_good"
CHECKSUM_KEY = "sac_edge_tensors_sha256"
#: No trained SAC weight comes near this; a larger one is damage, not learning.
MAX_ABS_WEIGHT = 1e4
#: A last good file holds the learner (actor, critics, targets) and a few thousand states: a few MiB to a
#: few tens of MiB for the widest networks sac-train accepts on a device; more is not one sac-edge wrote.
MAX_WEIGHTS_BYTES = 1 << 30
#: The most shadow states a save writes (the learner process's ``SHADOW_STATES``); a file with more was not
#: written by sac-edge, and re-checking int8 weights on millions of states would cost gigabytes at start.
MAX_STATES = 512
MAX_HEADER_BYTES = 16 << 20


@dataclass(frozen=True)
class PromotionRules:
    window: int
    rollback_threshold: float
    shadow_max_diff: float
    noise_z: float

    def __post_init__(self) -> None:
        if self.window < 1:
            raise SacEdgeError(f"--promotion-window must be >= 1 episode, got {self.window}")
        if not self.rollback_threshold >= 0:
            raise SacEdgeError(f"--rollback-threshold must be >= 0, got {self.rollback_threshold}")
        if not self.noise_z >= 0:
            raise SacEdgeError(f"--rollback-noise-z must be >= 0, got {self.noise_z}")
        if not 0 < self.shadow_max_diff <= 1:
            raise SacEdgeError(
                f"--shadow-max-diff is a fraction of the action range in (0, 1], got {self.shadow_max_diff}"
            )


class ShadowResult(NamedTuple):
    ok: bool
    reason: str
    mean_diff_frac: float
    max_diff_frac: float


def shadow_check(
    candidate: np.ndarray, good: np.ndarray, low: Sequence[float], high: Sequence[float], max_diff: float
) -> ShadowResult:
    """Candidate vs last good actions on the same states (env units)."""
    lo, hi = np.asarray(low, np.float64), np.asarray(high, np.float64)
    if candidate.size == 0:
        return ShadowResult(False, "no recent states to check on", math.nan, math.nan)
    if not np.isfinite(candidate).all():
        return ShadowResult(False, "non-finite actions", math.nan, math.nan)
    if (candidate < lo - 1e-6).any() or (candidate > hi + 1e-6).any():
        return ShadowResult(False, "actions outside the bounds", math.nan, math.nan)
    frac = np.abs(candidate.astype(np.float64) - good.astype(np.float64)) / (hi - lo)
    mean, worst = float(frac.mean()), float(frac.max())
    if mean > max_diff:
        return ShadowResult(False, f"mean action difference {mean:.1%} of the range > {max_diff:.1%}", mean, worst)
    return ShadowResult(True, "ok", mean, worst)


class Verdict(NamedTuple):
    regressed: bool
    candidate_mean: float
    good_mean: float
    allowed_drop: float
    """The larger of the threshold drop and ``noise_z`` standard errors: a drop beyond it rolls back."""
    noise_se: float


def judge(
    candidate_returns: Sequence[float], good_returns: Sequence[float], threshold: float, noise_z: float = 0.0
) -> Verdict:
    """Did the candidate's mean return drop by more than ``threshold`` x max(|good mean|, 1) *and* by more than
    ``noise_z`` standard errors of the difference of the means (Welch's; 0 with a single episode per side)?"""
    cand_r, good_r = np.asarray(candidate_returns, np.float64), np.asarray(good_returns, np.float64)
    cand, good = float(cand_r.mean()), float(good_r.mean())
    se = math.sqrt(sum(float(r.var(ddof=1)) / len(r) for r in (cand_r, good_r) if len(r) > 1))
    allowed = max(threshold * max(abs(good), 1.0), noise_z * se)
    return Verdict(cand < good - allowed, cand, good, allowed, se)


class LastGood(NamedTuple):
    """Weights read back from disk: learner tensors as numpy, the shadow states, and the facts."""

    tensors: dict[str, np.ndarray]
    states: np.ndarray
    info: dict[str, Any]
    sha256: str

    def actor(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.tensors.items() if k.startswith("actor.")}


def tensors_sha256(tensors: Mapping[str, np.ndarray]) -> str:
    """A checksum of named tensors (names, dtypes, shapes and bytes, in name order)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def damage(tensors: Mapping[str, np.ndarray]) -> str | None:
    """Why a weight set must not be served (a non-floating, non-finite or absurdly large network weight), or
    None. Integer weights would pass the finiteness and magnitude checks and be served as they are."""
    for name, arr in tensors.items():
        if not np.issubdtype(arr.dtype, np.floating):
            return f"{name} holds {arr.dtype} values, not floating-point weights"
        if name == STATES_KEY:
            continue
        if not np.isfinite(arr).all():
            return f"{name} holds non-finite values"
        if name.startswith(("actor.", "critic")) and arr.size and float(np.abs(arr).max()) > MAX_ABS_WEIGHT:
            return f"{name} holds a weight of magnitude {float(np.abs(arr).max()):.3g} (> {MAX_ABS_WEIGHT:g})"
    return None


class LastGoodStore:
    """``DIR/last_good.safetensors`` + ``DIR/last_good.json``, written atomically; the pair they replace is
    kept as ``DIR/previous.*``. ``DIR/lock`` (``common.lockfile.pid_lock``) keeps two fine-tuners apart."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.path = directory / LAST_GOOD
        self.info_path = directory / LAST_GOOD_INFO
        self.previous = directory / PREVIOUS
        self.lock = directory / LOCK

    def save(self, tensors: Mapping[str, np.ndarray], states: np.ndarray, info: Mapping[str, Any]) -> str:
        """Write the pair (tensors first), keeping the replaced pair as the previous generation; returns
        the tensors file's sha256."""
        from safetensors.numpy import save_file

        flat = {k: np.asarray(v, order="C") for k, v in tensors.items()}  # keeps 0-d (obs_norm.count)
        flat[STATES_KEY] = np.asarray(states, np.float32, order="C")
        facts = {**info, "saved_unix": time.time()}
        meta = {INFO_KEY: json.dumps(facts, default=float), CHECKSUM_KEY: tensors_sha256(flat)}
        with atomic_path(self.path) as tmp:
            save_file(flat, str(tmp), metadata=meta)
            if self.path.is_file():  # the replaced set stays one generation (renames: atomic, no copy)
                if self.info_path.is_file():
                    os.replace(self.info_path, self.dir / PREVIOUS_INFO)
                os.replace(self.path, self.previous)
        sha = hashlib.sha256(_read_bytes(self.path)).hexdigest()
        atomic_write_json(self.info_path, {**facts, "file": LAST_GOOD, "sha256": sha})
        return sha

    def exists(self) -> bool:
        """Whether anything is where the last good weights go (a symlink or a FIFO counts: never overwritten
        without --resume or --restart)."""
        return os.path.lexists(self.path)

    def holds_weights(self) -> bool:
        """Whether the directory holds fine-tuned weights of either generation (a power cut between a save's
        two renames, or a damaged set moved away, leaves only ``previous.safetensors``)."""
        return self.exists() or os.path.lexists(self.previous)

    def load(self) -> LastGood:
        """Read and verify the last good weights; a missing, corrupt or damaged set is a one-line error
        that names the previous generation when one is kept.

        The tensors file is self-describing and self-checking (metadata checksum of its tensors); the JSON
        sidecar is advisory: if it disagrees with the tensors file (a crash between the two writes), the
        tensors file wins and the mismatch is reported in ``info``.
        """
        if not self.exists():
            hint = self._fallback() if os.path.lexists(self.previous) else "run --finetune first"
            raise SacEdgeError(f"{self.path}: no last good weights to resume from; {hint}")
        meta, tensors, problem, sha = _read_verified(self.path)
        if problem is not None:
            raise SacEdgeError(f"{self.path}: last good weights are damaged ({problem}); {self._fallback()}")
        try:
            info = json.loads(meta.get(INFO_KEY, "{}"))
        except (json.JSONDecodeError, TypeError):
            info = {}
        if not isinstance(info, dict):
            info = {}
        sidecar = read_json_or_none(self.info_path, follow=False)
        info["sidecar"] = "missing" if sidecar is None else ("ok" if sidecar.get("sha256") == sha else "stale")
        states = tensors.pop(STATES_KEY, np.zeros((0, 0), np.float32))
        if not any(k.startswith("actor.") for k in tensors):
            raise SacEdgeError(f"{self.path}: holds no actor weights; not a sac-edge last good file")
        return LastGood(tensors, states, info, sha)

    def _fallback(self) -> str:
        """What to do about a damaged set: resume from the previous generation if it is intact."""
        if os.path.lexists(self.previous) and _read_verified(self.previous)[2] is None:
            generation = (read_json_or_none(self.dir / PREVIOUS_INFO, follow=False) or {}).get("generation", "unknown")
            return (
                f"the previous good generation ({generation}) is intact in {self.previous}: move it to "
                f"{self.path} to resume from it, or run --finetune --restart"
            )
        return "restore a copy, or run --finetune --restart to start again from the bundle weights"


def check_complete(last: LastGood, reference: Mapping[str, np.ndarray] | None, obs_dim: int) -> None:
    """Refuse last good weights that lack a tensor of the bundle's learner (``reference``; None when the
    bundle has none) or hold one of another shape, or whose shadow states are not ``obs_dim`` wide: a swap
    installs only the names it is given, so a missing one would be served from the bundle, mixed with the
    fine-tuned ones."""
    fix = "restore a copy, or run --finetune --restart to start again from the bundle weights"
    for name, value in (reference or {}).items():
        have = last.tensors.get(name)
        if have is None:
            raise SacEdgeError(f"the last good weights lack {name}, which the bundle's learner has; {fix}")
        if tuple(have.shape) != tuple(value.shape):
            raise SacEdgeError(
                f"the last good weights hold {name} of shape {tuple(have.shape)}, the bundle's learner "
                f"{tuple(value.shape)}; {fix}"
            )
    states = last.states
    if states.size and (states.ndim != 2 or states.shape[1] != obs_dim):
        raise SacEdgeError(f"the last good weights' shadow states have shape {states.shape}, not (n, {obs_dim}); {fix}")


def _states_rows(path: Path) -> int:
    """How many shadow states a last good file declares, from its header alone (nothing else read)."""
    fd = open_regular(path, "weights file", "restore a copy", follow=False)
    with os.fdopen(fd, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"a header of {size} bytes")
        header = json.loads(fh.read(size))
    shape = (header.get(STATES_KEY) or {}).get("shape") if isinstance(header, dict) else None
    return int(shape[0]) if isinstance(shape, list) and shape and isinstance(shape[0], int) else 0


def _read_bytes(path: Path) -> bytes:
    """A weights file's bytes: a regular file (not a symlink, FIFO or device) of at most MAX_WEIGHTS_BYTES."""
    return read_capped(path, MAX_WEIGHTS_BYTES, "weights file", "restore a copy", follow=False)


def _metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header (8-byte little-endian length, then JSON)."""
    size = int.from_bytes(data[:8], "little")
    if len(data) < 8 or size > len(data) - 8:
        raise ValueError("header length past the end of the file")
    meta = json.loads(data[8 : 8 + size]).get("__metadata__") or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("metadata is not a string table")
    return meta


def _read_verified(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray], str | None, str]:
    """A last good file's metadata, tensors (parsed from the bytes read once), why they must not be used
    (None when intact) and the sha256 of those bytes."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        rows = _states_rows(path)
        if rows > MAX_STATES:  # before the file is read or parsed whole
            return {}, {}, f"{rows} shadow states, more than the {MAX_STATES} a save writes", ""
        data = _read_bytes(path)
    except (OSError, SacEdgeError, ValueError, AttributeError) as err:
        return {}, {}, f"unreadable: {str(err)[:160]}", ""
    sha = hashlib.sha256(data).hexdigest()
    try:
        meta = _metadata(data)
        tensors = load(data)
    except (SafetensorError, ValueError, AttributeError, RecursionError) as err:
        return {}, {}, f"unreadable: {str(err)[:120]}", sha
    expected = meta.get(CHECKSUM_KEY)
    if expected is None:
        return meta, tensors, "no tensor checksum in its metadata", sha
    if tensors_sha256(tensors) != expected:
        return meta, tensors, "tensor checksum mismatch: the file changed after it was written", sha
    return meta, tensors, damage(tensors), sha
