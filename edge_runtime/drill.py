"""``sac-edge drill BUNDLE --env ID``: fault drills that measure the shield.

Each fault runs with the shield (``--shield on``) and without it (``guards``) on the same seeded episodes,
through the runtime library (``runtime.py``, the path both ``sac-edge run`` and a robot's own loop use),
unpaced. Faults (:class:`FaultInjector`, a gymnasium wrapper; the policy sees the faulty observation, the
env steps on the true state):

- ``none``: nominal episodes (false alarms are counted here);
- ``nan``: NaN on ``--fault-dim`` for ``--fault-steps`` steps from ``--fault-start``;
- ``stuck``: the observation before the onset repeated bit for bit for ``--fault-steps`` steps;
- ``spike``: ``--spike-sigma`` standard deviations (the envelope's scale) added to ``--fault-dim``;
- ``drop``: each observation of the burst dropped with probability ``--drop-rate`` (the previous one repeated);
- ``delay``: from the onset to the episode's end, the observation of ``--delay-steps`` steps before, and
  with ``--action-delay-steps K`` each action applied K steps late (the action sent K steps before);
- ``ood_start``: the start state pushed away from the reset distribution (MuJoCo: ``--ood-scale`` added to
  joint velocities; other envs with a ``state`` array: that much times the state's magnitude);
- ``swap``: at the onset the policy's actor weights are swapped for perturbed ones (the shield is told, as
  the fine-tuner tells it), which measures the ramp after a swap.

Per fault and mode: non-finite and out-of-bound actions, fallbacks and the steps from the onset to the first
one, false alarms (fallbacks before the onset, or anywhere in ``none``) per nominal step, the mean
return, the largest step-to-step action change (from the action at rest before the first step) overall, in
the first ``START_STEPS`` and after the swap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from sac_edge.common.atomic import atomic_write_json, check_new_file
from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import ENVELOPE_KIND, FP32, MANIFEST
from sac_edge.common.config import config_dict
from sac_edge.common.envelope import Envelope, parse_envelope
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.spec import PolicySpec
from sac_edge.common.table import format_table

from .config import BackendSection, DrillConfig, RuntimeOptions
from .preflight import check_action_sizes, check_gate
from .runtime import Runtime

FAULTS = ("none", "nan", "stuck", "spike", "drop", "delay", "ood_start", "swap")
MODES = ("on", "guards")
MAX_EPISODES = 1000
"""``--episodes`` at most: each is run per fault and mode (16 runs of each episode with every fault), so a
thousand Pendulum episodes is already hours of drill."""
MAX_STEPS = 1_000_000
"""``--max-steps`` and the fault's step counts at most (an env without a time limit ends at ``--max-steps``)."""
MAX_FAULT_SCALE = 1e4
"""``--spike-sigma`` and ``--ood-scale`` at most: a larger fault says nothing a smaller one does not, and 1e308
overflowed the env's state (a drill returning -inf)."""
START_STEPS = 20
"""The largest action change in the first this many steps of an episode is reported as the start jump."""
SWAP_NOISE = 0.5
"""The swapped-in actor: each weight tensor plus Gaussian noise of this fraction of its own std."""
DRILL_RATE_HZ = 10.0
"""The nominal rate the runtime is opened at: the drill runs unpaced, and the inference budget (half the
period) must not turn a busy machine into overruns the drill would count as fallbacks."""


class FaultInjector(gym.Wrapper):
    """Injects one fault into the observations the policy sees (module docstring)."""

    def __init__(self, env: gym.Env, fault: str, cfg: DrillConfig, sigma: np.ndarray, rng: np.random.Generator) -> None:
        super().__init__(env)
        self.fault, self.cfg, self.sigma, self.rng = fault, cfg, sigma, rng
        self.t = 0
        self.history: list[np.ndarray] = []
        self.sent: list[np.ndarray] = []  # this episode's actions, for the delay fault's action delay
        self.seen: np.ndarray | None = None

    @property
    def onset(self) -> int | None:
        """The step index whose observation is the first faulty one (None: no fault in the observations)."""
        if self.fault in ("none", "swap"):
            return None if self.fault == "none" else self.cfg.fault_start
        return 0 if self.fault == "ood_start" else self.cfg.fault_start

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.t, self.history, self.sent = 0, [], []
        if self.fault == "ood_start":
            obs = self._push(obs)
        return self._seen(np.asarray(obs, dtype=np.float32)), info

    def step(self, action: Any) -> tuple[np.ndarray, Any, Any, Any, dict[str, Any]]:
        late = self.cfg.action_delay_steps
        if self.fault == "delay" and late:
            self.sent.append(np.array(action, copy=True))
            if self.t >= self.cfg.fault_start:
                action = self.sent[max(0, self.t - late)]
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return self._seen(np.asarray(obs, dtype=np.float32)), reward, terminated, truncated, info

    def _push(self, obs: Any) -> Any:
        scale, base = self.cfg.ood_scale, self.env.unwrapped
        if hasattr(base, "set_state") and hasattr(base, "data") and hasattr(base, "_get_obs"):  # MuJoCo
            qpos, qvel = np.array(base.data.qpos), np.array(base.data.qvel)
            base.set_state(qpos, qvel + self.rng.normal(0.0, scale, qvel.shape))
            return base._get_obs()
        state = getattr(base, "state", None)
        if isinstance(state, np.ndarray) and hasattr(base, "_get_obs"):
            pushed = state + self.rng.normal(0.0, scale, state.shape) * (np.abs(state) + 1.0)
            setattr(base, "state", pushed)  # noqa: B010 (classic-control envs keep their state here)
            return base._get_obs()
        raise SacEdgeError(
            f"--faults ood_start: {type(base).__name__} has neither MuJoCo's set_state nor a state array to push; "
            "drop ood_start from --faults for this env"
        )

    def _seen(self, true: np.ndarray) -> np.ndarray:
        """The observation the policy gets at step ``self.t``."""
        cfg, t = self.cfg, self.t
        self.history.append(true)
        obs = true.copy()
        burst = cfg.fault_start <= t < cfg.fault_start + cfg.fault_steps
        if self.fault == "nan" and burst:
            obs[cfg.fault_dim] = np.nan
        elif self.fault == "spike" and burst:
            obs[cfg.fault_dim] += cfg.spike_sigma * self.sigma[cfg.fault_dim]
        elif self.fault in ("stuck", "drop") and burst and self.seen is not None:
            if self.fault == "stuck" or self.rng.random() < cfg.drop_rate:
                obs = self.seen.copy()
        elif self.fault == "delay" and t >= cfg.fault_start:
            obs = self.history[max(0, t - cfg.delay_steps)].copy()
        self.seen = obs
        return obs


def check_drill(cfg: DrillConfig) -> tuple[str, ...]:
    """The faults to run, after every flag is checked (one line each, before any work)."""
    faults = cfg.faults or FAULTS
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise SacEdgeError(f"--faults: unknown {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    for flag, value, least, most in (
        ("--episodes", cfg.episodes, 1, MAX_EPISODES),
        ("--max-steps", cfg.max_steps, 0, MAX_STEPS),
        ("--fault-start", cfg.fault_start, 1, MAX_STEPS),
        ("--fault-steps", cfg.fault_steps, 1, MAX_STEPS),
        ("--delay-steps", cfg.delay_steps, 1, MAX_STEPS),
        ("--action-delay-steps", cfg.action_delay_steps, 0, MAX_STEPS),
        ("--fault-dim", cfg.fault_dim, 0, None),
    ):
        if value < least:
            raise SacEdgeError(f"{flag} must be at least {least}, got {value}")
        if most is not None and value > most:
            raise SacEdgeError(f"{flag} must be at most {most}, got {value}; a drill is meant to end in minutes")
    if cfg.max_steps and cfg.fault_start >= cfg.max_steps and any(f not in ("none", "ood_start") for f in faults):
        raise SacEdgeError(
            f"--fault-start {cfg.fault_start} is not below --max-steps {cfg.max_steps}: the fault would never "
            "start; lower --fault-start or raise --max-steps"
        )
    for flag, number in (("--spike-sigma", cfg.spike_sigma), ("--ood-scale", cfg.ood_scale)):
        if not 0 < number <= MAX_FAULT_SCALE:
            raise SacEdgeError(f"{flag} must be a positive number of at most {MAX_FAULT_SCALE:g}, got {number}")
    if not 0 < cfg.drop_rate <= 1:
        raise SacEdgeError(f"--drop-rate is a probability in (0, 1], got {cfg.drop_rate}")
    cfg.shield.check()
    out = saved_path(cfg)
    if out is not None:
        check_new_file(out, "--out" if cfg.out else "--save", replace=cfg.overwrite, replace_flag="--overwrite")
    return tuple(dict.fromkeys(faults))


def saved_path(cfg: DrillConfig) -> Path | None:
    """Where the results go: ``--out``, or with ``--save`` beside the bundle (``BUNDLE.drill.json``)."""
    if cfg.out:
        return Path(cfg.out)
    if cfg.save:  # resolved: ``drill . --save`` names the bundle ".", whose "parent" is the bundle itself
        bundle = Path(cfg.bundle).resolve()
        if not bundle.name:
            raise SacEdgeError(f"--save: {cfg.bundle} has no directory beside it; use --out FILE")
        return bundle.parent / f"{bundle.name}.drill.json"
    return None


def drill_command(cfg: DrillConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Run every fault with and without the shield; the rows and the facts (also written per ``--out``)."""
    faults = check_drill(cfg)
    out = saved_path(cfg)
    bundle = open_bundle(cfg.bundle, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade)
    spec = bundle.frame_spec  # the env's frame: the runtime assembles any wider policy input
    check_gate(bundle)
    check_action_sizes(cfg.shield, spec.act_dim)  # before the env is made
    env_name = cfg.env or file_env(spec.env_id, str(bundle.path / MANIFEST))
    obs_space, act_space = _env_spaces(env_name, spec)
    if cfg.fault_dim >= spec.obs_dim:
        raise SacEdgeError(f"--fault-dim must be below the bundle's obs_dim {spec.obs_dim}, got {cfg.fault_dim}")
    envelope = _envelope(bundle)
    if envelope is None:
        log(f"sac-edge drill: {bundle.path} has no envelope.json; the shield runs without the envelope check")
    sigma = envelope.scale if envelope is not None else np.ones(spec.obs_dim)
    original, swapped = _actor_sets(bundle, cfg.seed) if "swap" in faults else (None, None)
    low, high = act_space.low.astype(np.float64), act_space.high.astype(np.float64)
    setting = _FaultSetting(env_name, sigma, low, high, swapped, original)
    rows = []
    for mode in MODES:
        options = RuntimeOptions(
            bundle=cfg.bundle,
            env=env_name,
            backend=BackendSection(kind=cfg.backend, precision=FP32),
            rate_hz=DRILL_RATE_HZ,
            shield=cfg.shield if mode == "on" else None,
            seed=cfg.seed,
            trusted_keys=cfg.trusted_keys,
            allow_downgrade=cfg.allow_downgrade,
        )
        with Runtime(options, obs_low=obs_space.low, obs_high=obs_space.high, log=log) as runtime:
            for fault in faults:
                row = _run_fault(runtime, fault, cfg, setting)
                rows.append({"fault": fault, "shield": mode, **row})
    result = {
        "bundle": str(bundle.path),
        "env": env_name,
        "envelope": envelope is not None,
        "config": config_dict(cfg),
        "rows": rows,
        "checks": _checks(rows, cfg),
    }
    if out is not None:
        atomic_write_json(out, result, replace=cfg.overwrite)
        result["written"] = str(out)
    return result


def _env_spaces(env_name: str, spec: PolicySpec) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """The env's observation and action spaces, refused in one line unless they are the bundle's sizes."""
    probe = make_env(env_name)
    try:
        obs_space, act_space = probe.observation_space, probe.action_space
        assert isinstance(obs_space, gym.spaces.Box) and isinstance(act_space, gym.spaces.Box)
        if obs_space.shape != (spec.obs_dim,) or act_space.shape != (spec.act_dim,):
            raise SacEdgeError(
                f"{env_name}: observation {obs_space.shape} / action {act_space.shape} do not match the bundle's "
                f"spec (obs_dim={spec.obs_dim}, act_dim={spec.act_dim})"
            )
        return obs_space, act_space
    finally:
        probe.close()


def _envelope(bundle: Bundle) -> Envelope | None:
    """The bundle's observation envelope, from its verified bytes (None when it has none)."""
    names = bundle.files(ENVELOPE_KIND)
    if not names:
        return None
    spec = bundle.frame_spec
    return parse_envelope(bundle.read(bundle.path / names[0]), bundle.path / names[0], spec.obs_dim, spec.act_dim)


def _actor_sets(bundle: Bundle, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The fp32 graph's actor weights (from the verified bytes), and the same plus noise: what the swap
    installs, and what is installed back after the episode."""
    import onnx
    from onnx import numpy_helper

    path = bundle.onnx(FP32)
    if path is None:
        raise SacEdgeError(f"{bundle.path}: --faults swap needs the fp32 graph policy.onnx")
    rng = np.random.default_rng(seed)
    graph = onnx.load_from_string(bundle.read(path)).graph
    original, perturbed = {}, {}
    for init in graph.initializer:
        if init.name.startswith("actor.") and init.data_type == onnx.TensorProto.FLOAT:
            arr = np.asarray(numpy_helper.to_array(init), dtype=np.float32)
            original[init.name] = arr
            noise = rng.standard_normal(arr.shape).astype(np.float32) * SWAP_NOISE * (arr.std() + 1e-3)
            perturbed[init.name] = arr + noise
    if not original:
        raise SacEdgeError(f"{path}: no actor.* weights to swap; --faults swap needs a sac-export graph")
    return original, perturbed


class _FaultSetting(NamedTuple):
    """What every fault of a drill shares: the env, the envelope's scale (``sigma``), the action bounds and the
    actor weights a swap installs (``swapped``) and puts back afterwards (``original``)."""

    env_name: str
    sigma: np.ndarray
    low: np.ndarray
    high: np.ndarray
    swapped: dict[str, np.ndarray] | None
    original: dict[str, np.ndarray] | None

    def rest(self) -> np.ndarray:
        """The action at rest before an episode's first step (what the first jump is measured from)."""
        return np.clip(np.zeros_like(self.low), self.low, self.high)


@dataclass
class _FaultTally:
    """One fault's counts over its episodes, turned into the row by ``row``."""

    steps: int = 0
    nonfinite: int = 0
    out_of_bounds: int = 0
    nominal_steps: int = 0
    false_alarms: int = 0
    fallbacks: int = 0
    missed: int = 0
    to_fallback: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    jumps: list[float] = field(default_factory=lambda: [0.0])
    start_jumps: list[float] = field(default_factory=lambda: [0.0])
    swap_jumps: list[float] = field(default_factory=lambda: [0.0])

    def action(
        self, action: np.ndarray, previous: np.ndarray, setting: _FaultSetting, t: int, swap_at: int | None
    ) -> None:
        """A bad action, and the jump from the previous one (``swap_at``: the swap's onset, None without one)."""
        self.steps += 1
        finite = bool(np.isfinite(action).all())
        if not finite:
            self.nonfinite += 1
        elif np.any(action < setting.low) or np.any(action > setting.high):
            self.out_of_bounds += 1
        jump = float(np.max(np.abs(action - previous))) if finite else math.inf
        self.jumps.append(jump)
        if t < START_STEPS:
            self.start_jumps.append(jump)
        if swap_at is not None and swap_at <= t < swap_at + START_STEPS:
            self.swap_jumps.append(jump)

    def fallbacks_entered(self, entered: int, faulty: bool) -> None:
        """The shield's fallbacks entered this step; before the onset (or without a fault) they are false alarms."""
        self.fallbacks += entered
        if not faulty:
            self.false_alarms += entered

    def episode_done(self, total: float, onset: int | None, first: int | None, fault: str) -> None:
        """An episode's return, and how long after the onset the shield fell back (or that it never did)."""
        self.returns.append(total)
        if onset is not None and fault != "swap":
            if first is None:
                self.missed += 1
            else:
                self.to_fallback.append(first)

    def row(self, fault: str, episodes: int, shielded: bool) -> dict[str, Any]:
        """One row of the drill's table (the shield's columns None without a shield)."""
        return {
            "episodes": episodes,
            "steps": self.steps,
            "nonfinite_actions": self.nonfinite,
            "out_of_bound_actions": self.out_of_bounds,
            "fallbacks": self.fallbacks if shielded else None,
            "steps_to_fallback": max(self.to_fallback) if self.to_fallback else None,
            "episodes_without_fallback": self.missed if shielded and fault not in ("none", "swap") else None,
            "false_alarms": self.false_alarms if shielded else None,
            "nominal_steps": self.nominal_steps,
            "false_alarm_rate": self.false_alarms / self.nominal_steps if shielded and self.nominal_steps else None,
            "mean_return": float(np.mean(self.returns)) if self.returns else None,
            "max_action_jump": max(self.jumps),
            "start_jump": max(self.start_jumps),
            "swap_jump": max(self.swap_jumps) if fault == "swap" else None,
        }


def _run_fault(runtime: Runtime, fault: str, cfg: DrillConfig, setting: _FaultSetting) -> dict[str, Any]:
    """``cfg.episodes`` seeded episodes of one fault on ``runtime``; the row."""
    tally = _FaultTally()
    for episode in range(cfg.episodes):
        seed = cfg.seed + episode
        env = FaultInjector(make_env(setting.env_name), fault, cfg, setting.sigma, np.random.default_rng(seed))
        try:
            _run_episode(runtime, env, fault, cfg, setting, seed, tally)
        finally:
            env.close()
            if fault == "swap" and setting.original is not None:
                runtime.backend.swap_weights(setting.original)
    return tally.row(fault, cfg.episodes, runtime.shield is not None)


def _run_episode(
    runtime: Runtime,
    env: FaultInjector,
    fault: str,
    cfg: DrillConfig,
    setting: _FaultSetting,
    seed: int,
    tally: _FaultTally,
) -> None:
    """One seeded episode of ``fault`` through ``runtime.act`` and ``observe``, counted into ``tally``."""
    shield = runtime.shield
    onset = env.onset
    obs, _ = env.reset(seed=seed)
    limit = cfg.max_steps or (env.spec.max_episode_steps if env.spec else None) or 1000
    total, previous, first = 0.0, setting.rest(), None
    before = shield.counts.fallbacks if shield is not None else 0
    for t in range(limit):
        if fault == "swap" and t == onset:
            assert setting.swapped is not None
            runtime.backend.swap_weights(setting.swapped)
            if shield is not None:
                shield.weights_swapped()
        action = np.array(runtime.act(obs), dtype=np.float64)
        tally.action(action, previous, setting, t, onset if fault == "swap" else None)
        previous = action
        faulty = onset is not None and t >= onset
        if shield is not None:
            tally.fallbacks_entered(shield.counts.fallbacks - before, faulty)
            before = shield.counts.fallbacks
            if faulty and fault != "swap" and first is None and shield.falling_back:
                first = t - onset  # type: ignore[operator]
        if not faulty:
            tally.nominal_steps += 1
        next_obs, reward, terminated, truncated, _ = env.step(action.astype(np.float32))
        total += float(reward)
        done = bool(terminated or truncated) or t == limit - 1
        runtime.observe(obs, action, float(reward), next_obs, bool(terminated), done)
        obs = next_obs
        if done:
            break
    tally.episode_done(total, onset, first, fault)


def _checks(rows: Sequence[dict[str, Any]], cfg: DrillConfig) -> dict[str, Any]:
    """What the issue's goals ask of the rows: zero bad actions, fallback within one step after the window,
    the false-alarm rate on nominal steps."""
    knobs = cfg.shield
    windows = {"nan": knobs.shield_window - 1, "spike": knobs.shield_window - 1, "stuck": max(knobs.stuck_steps - 2, 0)}
    late = [
        r["fault"]
        for r in rows
        if r["shield"] == "on" and r["fault"] in windows and r["steps_to_fallback"] is not None
        and r["steps_to_fallback"] > windows[r["fault"]] + 1
    ]  # fmt: skip
    nominal = [r for r in rows if r["shield"] == "on"]
    nominal_steps = sum(r["nominal_steps"] for r in nominal)
    return {
        "bad_actions": sum(r["nonfinite_actions"] + r["out_of_bound_actions"] for r in rows),
        "late_fallbacks": late,
        "expected_steps_to_fallback": windows,
        "nominal_false_alarm_rate": (sum(r["false_alarms"] for r in nominal) / nominal_steps)
        if nominal_steps
        else None,
    }


def drill_table(result: dict[str, Any]) -> str:
    header = ("fault", "shield", "non-finite", "out of bounds", "fallbacks", "to fallback", "false alarms",
              "return", "max jump", "start jump", "swap jump")  # fmt: skip
    rows = [
        (
            r["fault"],
            r["shield"],
            r["nonfinite_actions"],
            r["out_of_bound_actions"],
            _cell(r["fallbacks"]),
            _cell(r["steps_to_fallback"]),
            _cell(r["false_alarms"]),
            f"{r['mean_return']:.1f}",
            f"{r['max_action_jump']:.3f}",
            f"{r['start_jump']:.3f}",
            _cell(r["swap_jump"]),
        )
        for r in result["rows"]
    ]
    return format_table(rows, header)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
