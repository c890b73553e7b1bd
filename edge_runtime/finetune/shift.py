"""Domain shift for tests and demos: change an environment's dynamics so fine-tuning has something to recover.

``ShiftedDynamics(env, g=13)`` (or ``sac-edge run --shift g=13``) changes the physics of the wrapped env once,
at construction; observation and action spaces stay the same, so a policy trained on the nominal env runs
unchanged and simply does worse (bench/finetune.py measures how much for several shifts).

- Classic-control envs (Pendulum-v1): a name is a numeric attribute of ``env.unwrapped`` and the value is
  set as given, e.g. ``m`` (pole mass, 1.0), ``l`` (length, 1.0), ``g`` (gravity, 10.0); Pendulum's ``step``
  reads them on every call (gymnasium ``envs/classic_control/pendulum.py``: ``3g/(2l) sin(th)`` for gravity,
  ``3/(m l^2) u`` for the torque, so ``m`` only scales how much the motor can do).
- MuJoCo envs (HalfCheetah-v5, ...): ``friction``, ``mass`` and ``gravity`` are *scales* of the compiled
  model's ``geom_friction[:, 0]`` (sliding friction of every geom), ``body_mass`` and ``opt.gravity``
  (MuJoCo ``mjModel`` fields, which ``mj_step`` reads each step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import gymnasium as gym
import numpy as np

from sac_edge.common.errors import SacEdgeError

MUJOCO_SCALES = ("friction", "mass", "gravity")


def parse_shift(items: Sequence[str]) -> dict[str, float]:
    """``("m=1.6", "g=9")`` -> ``{"m": 1.6, "g": 9.0}`` (one-line error on a malformed item)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep or not name.strip():
                raise ValueError
            number = float(value)
        except ValueError:
            raise SacEdgeError(f"--shift entry {item!r} is not NAME=NUMBER (e.g. m=1.6)") from None
        if not math.isfinite(number):  # a NaN gravity makes every observation NaN: a dead plant, not a shift
            raise SacEdgeError(f"--shift entry {item!r} must be a finite number (e.g. m=1.6)")
        out[name.strip()] = number
    return out


class ShiftedDynamics(gym.Wrapper):
    """The wrapped env with some physical parameters changed; ``shift`` records old and new values."""

    def __init__(self, env: gym.Env, **params: float) -> None:
        super().__init__(env)
        self.shift: dict[str, dict[str, Any]] = {}
        base = env.unwrapped
        model = getattr(base, "model", None)
        for name, value in params.items():
            if model is not None and hasattr(model, "geom_friction") and name in MUJOCO_SCALES:
                self.shift[name] = {"scale": value, **_scale_mujoco(model, name, value)}
            elif isinstance(getattr(base, name, None), Real) and not isinstance(getattr(base, name), bool):
                old = float(getattr(base, name))
                setattr(base, name, type(getattr(base, name))(value))
                self.shift[name] = {"old": old, "new": float(value)}
            else:
                known = MUJOCO_SCALES if model is not None else _numeric_attributes(base)
                raise SacEdgeError(
                    f"--shift {name}: {type(base).__name__} has no such dynamics parameter; "
                    f"use one of {', '.join(known)}"
                )


def _scale_mujoco(model: Any, name: str, scale: float) -> dict[str, Any]:
    if not scale > 0:
        raise SacEdgeError(f"--shift {name}={scale}: a MuJoCo scale must be positive")
    if name == "friction":
        old = float(np.mean(model.geom_friction[:, 0]))
        model.geom_friction[:, 0] *= scale
        return {"old_mean": old, "new_mean": float(np.mean(model.geom_friction[:, 0]))}
    if name == "mass":
        old = float(np.sum(model.body_mass))
        model.body_mass[:] *= scale
        return {"old_total": old, "new_total": float(np.sum(model.body_mass))}
    old_g = [float(x) for x in model.opt.gravity]
    model.opt.gravity[:] *= scale
    return {"old": old_g, "new": [float(x) for x in model.opt.gravity]}


def _numeric_attributes(base: Any) -> list[str]:
    return sorted(
        k for k, v in vars(base).items() if isinstance(v, Real) and not isinstance(v, bool) and not k.startswith("_")
    )


def shifted(env: gym.Env, params: Mapping[str, float]) -> gym.Env:
    """``env`` itself when ``params`` is empty, else wrapped in :class:`ShiftedDynamics`."""
    return ShiftedDynamics(env, **params) if params else env
