"""Action delay in control steps: the distribution ``sac-train --action-delay`` / ``--delay-profile`` train
under (sampled once per episode), recorded in the run dir and the bundle, and the env wrapper that applies
it (``sac-edge drill``'s ``delay`` fault uses the same wrapper).

A delay of d steps: the action chosen at step t reaches the env at step t + d; the first d steps of an
episode apply the middle of the action bounds (the policy's 0). A profile measured on the device (the
``--json`` of ``sac-edge bench`` or ``sac-edge run``, or the ROS 2 node's summary) becomes steps at the env's
control period ``dt``: a delay of s seconds is ``floor(s / dt + 0.5)`` steps (the nearest step), with the
profile's median carrying half the probability, its p99 the next 49% and its max the last 1% (each a
step's worth of inference time, plus the step's start lateness where the file has it; from the node's
summary, its step time: input taken to command published).
"""

from __future__ import annotations

import collections
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from .errors import SacEdgeError
from .jsonfile import read_json

#: The largest delay in control steps (each is a last action in the policy's input).
MAX_DELAY = 64


@dataclass(frozen=True)
class DelayDistribution:
    """Delay in control steps and its probability (sorted by steps; probabilities sum to 1)."""

    steps: tuple[int, ...]
    probs: tuple[float, ...]
    source: str

    @property
    def largest(self) -> int:
        return max(self.steps)

    def quantile(self, q: float) -> int:
        """The smallest delay whose cumulative probability reaches ``q``."""
        total = 0.0
        for steps, p in zip(self.steps, self.probs):
            total += p
            if total >= q - 1e-12:
                return steps
        return self.steps[-1]

    def sample(self, rng: np.random.Generator) -> int:
        return int(self.steps[int(rng.choice(len(self.steps), p=np.asarray(self.probs)))])

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": list(self.steps),
            "probs": [round(p, 6) for p in self.probs],
            "source": self.source,
            "median": self.quantile(0.5),
            "p99": self.quantile(0.99),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str) -> DelayDistribution:
        try:
            steps = tuple(data["steps"])
            probs = tuple(float(p) for p in data["probs"])
            if not all(isinstance(s, int) and not isinstance(s, bool) for s in steps):
                raise TypeError("steps must be integers")
        except (KeyError, TypeError, ValueError) as err:
            raise SacEdgeError(f"{source}: action delay record is malformed ({err})") from None
        return _checked(steps, probs, str(data.get("source", "")), source)


def _checked(steps: tuple[int, ...], probs: tuple[float, ...], origin: str, source: str) -> DelayDistribution:
    if not steps or len(steps) != len(probs) or not all(0 <= s <= MAX_DELAY for s in steps):
        raise SacEdgeError(f"{source}: an action delay must be 0 to {MAX_DELAY} control steps")
    if not all(p >= 0 and math.isfinite(p) for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-4):
        raise SacEdgeError(f"{source}: action delay probabilities must be finite, >= 0 and sum to 1")
    merged: dict[int, float] = collections.defaultdict(float)
    for s, p in zip(steps, probs):
        merged[s] += p
    keys, total = sorted(merged), sum(probs)  # a record's rounding (6 digits) normalised away
    return DelayDistribution(tuple(keys), tuple(merged[k] / total for k in keys), origin)


def parse_action_delay(text: str) -> DelayDistribution:
    """``--action-delay K`` (always K steps) or ``A-B`` (uniform over A..B, sampled per episode)."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if match is None:
        raise SacEdgeError(f"--action-delay takes K or A-B (control steps), got {text!r}")
    low = int(match.group(1))
    high = int(match.group(2)) if match.group(2) is not None else low
    if low > high or high > MAX_DELAY:
        raise SacEdgeError(f"--action-delay {text}: needs A <= B <= {MAX_DELAY} control steps")
    steps = tuple(range(low, high + 1))
    return _checked(steps, tuple(1.0 / len(steps) for _ in steps), f"--action-delay {text.strip()}", "--action-delay")


def _quantiles_us(data: dict[str, Any], path: str) -> tuple[float, float, float]:
    """(p50, p99, max) of the delay in microseconds: inference latency (+ the step start's lateness)."""
    latency: Any = data.get("latency_us")
    if latency is None and isinstance(data.get("node"), dict):  # the ROS 2 node's summary (file or last line)
        latency = _node_step_us(data["node"], data.get("runtime"))
    if latency is None and isinstance(data.get("rows"), list):  # sac-edge bench: batch-1 rows, the fastest
        rows: list[Any] = [r.get("latency_us") for r in data["rows"] if isinstance(r, dict) and r.get("batch") == 1]
        ones: list[dict[str, Any]] = [r for r in rows if isinstance(r, dict) and _finite(r.get("p99"))]
        latency = min(ones, key=lambda r: float(r["p99"])) if ones else None
    if not isinstance(latency, dict) or not all(_finite(latency.get(k)) for k in ("p50", "p99")):
        raise SacEdgeError(f"--delay-profile {path}: no step latency (latency_us p50/p99) in it; {PROFILE_FIX}")
    jitter: Any = data.get("jitter_us") if isinstance(data.get("jitter_us"), dict) else {}
    out = []
    for key in ("p50", "p99", "max"):
        got: Any = latency.get(key)
        value = float(got) if _finite(got) else float(latency["p99"])
        extra = float(jitter[key]) if _finite(jitter.get(key)) else 0.0
        out.append(value + extra)
    return out[0], out[1], out[2]


def _node_step_us(node: dict[str, Any], runtime: Any) -> dict[str, Any] | None:
    """The ROS 2 node's step time (input taken to command published: p50, p99) as ``latency_us``; its max is
    at least the p99 and the slowest inference (the runtime's ``latency_us.max``), the only max it records."""
    p50: Any = node.get("step_p50_us")
    p99: Any = node.get("step_p99_us")
    if not (_finite(p50) and _finite(p99)):
        return None
    inference: Any = runtime.get("latency_us") if isinstance(runtime, dict) else None
    slowest: Any = inference.get("max") if isinstance(inference, dict) else None
    return {"p50": p50, "p99": p99, "max": max(float(p99), float(slowest) if _finite(slowest) else 0.0)}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


#: What ``--delay-profile`` takes, said by each of its errors.
PROFILE_FIX = "pass the --json output of sac-edge bench or sac-edge run, or the ROS 2 node's summary"


def delay_from_profile(path: str, dt: float) -> DelayDistribution:
    """The delay distribution in control steps of ``dt`` seconds that a measured profile implies."""
    file = Path(path)
    data = read_json(file, "--delay-profile file", PROFILE_FIX, follow=False)  # names a missing file, a FIFO
    p50, p99, top = _quantiles_us(data, path)
    steps = tuple(min(MAX_DELAY, math.floor(us * 1e-6 / dt + 0.5)) for us in (p50, p99, top))
    origin = f"--delay-profile {file.name}: p50/p99/max {p50:.0f}/{p99:.0f}/{top:.0f} us at dt {dt:g} s"
    return _checked(steps, (0.5, 0.49, 0.01), origin, f"--delay-profile {path}")


def env_dt(env: gym.Env) -> float:
    """The env's control period in seconds (``dt`` of MuJoCo and classic-control envs, else 1/render_fps)."""
    raw: Any = env.unwrapped
    dt = getattr(raw, "dt", None)
    if isinstance(dt, (int, float)) and dt > 0:
        return float(dt)
    fps = (getattr(raw, "metadata", None) or {}).get("render_fps")
    if isinstance(fps, (int, float)) and fps > 0:
        return 1.0 / float(fps)
    raise SacEdgeError("--delay-profile needs the env's control period (its dt or render_fps); use --action-delay K")


class ActionDelay(gym.Wrapper):
    """Applies each action ``d`` steps late, ``d`` drawn from ``delay`` at every reset (its own generator,
    seeded from the reset's seed, so a seeded episode has a seeded delay)."""

    def __init__(self, env: gym.Env, delay: DelayDistribution, seed_offset: int = 7919) -> None:
        super().__init__(env)
        self.delay, self._offset = delay, seed_offset
        self.rng = np.random.default_rng(seed_offset)
        space = env.action_space
        assert isinstance(space, gym.spaces.Box)
        self._middle = ((space.low.astype(np.float64) + space.high) / 2).astype(space.dtype)
        self.steps = 0
        self.queue: collections.deque[np.ndarray] = collections.deque()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed + self._offset)
        self.steps = self.delay.sample(self.rng)
        self.queue = collections.deque(self._middle.copy() for _ in range(self.steps))
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        if not self.steps:
            return self.env.step(action)
        self.queue.append(np.array(action, copy=True))
        return self.env.step(self.queue.popleft())

    def state(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "steps": self.steps, "queue": [a.tolist() for a in self.queue]}

    def load_state(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.steps = int(state["steps"])
        # float64 holds any action's value exactly (a float32 middle or policy action, a float64 scaled one)
        self.queue = collections.deque(np.asarray(a, np.float64) for a in state["queue"])
