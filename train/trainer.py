"""The training loop: collect with vector envs, update, evaluate, checkpoint atomically, resume exactly.

Everything needed to continue bit-for-bit (learner, optimisers, replay, torch/numpy/env RNG states, the
envs' physical state and the current observations) goes into one ``checkpoint.safetensors`` written
atomically, so a crash mid-save leaves the previous checkpoint whole. ``trainer_state.json`` is a
readable copy of the counters and RNG states.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from tqdm import tqdm

import sac_edge
from sac_edge.common.atomic import atomic_path, atomic_write_json, check_output_path
from sac_edge.common.config import check_fields, config_dict, resume_conflicts
from sac_edge.common.delay import ActionDelay, DelayDistribution, delay_from_profile, env_dt, parse_action_delay
from sac_edge.common.envs import file_env, make_env
from sac_edge.common.errors import InternalError, SacEdgeError
from sac_edge.common.jsonfile import read_json
from sac_edge.common.obs_history import ObsAssembler, ObsContract
from sac_edge.common.rollout import policy_inputs
from sac_edge.common.spec import PolicySpec

from . import checkpoint as ckpt
from .config import RESUME_TAKES, TrainConfig, check_values
from .cost import cost_fields, cost_line, eta_s
from .defaults import cpu_bf16_flags, resolve_speed
from .envs import env_state, make_vector_env, policy_spec, restore_env_state
from .evaluate import evaluate
from .metrics import MetricsLog
from .monitor import IntervalMonitor
from .policies import InferencePolicy
from .profiling import WARMUP_UPDATES, ProfileSession, check_fits, enable_ranges, phase
from .profiling import report as profile_report
from .sac import SAC
from .stopping import Stopped, stop_on_signals
from .threads import ThreadWatch, choose_threads, torch_threads, watched_record, with_change
from .update_types import UpdateMetrics

EVAL_SEED_OFFSET = 10_000
RECENT_EPISODES = 10


class TrainSummary(NamedTuple):
    """What ``sac-train --json`` prints."""

    run: str
    steps: int
    updates: int
    episodes: int
    updates_per_s: float
    final_eval_return: float | None
    wall_s: float
    compile_s: float | None  # the first (compiling) update under --compile on; None otherwise
    # Speed, memory and cost (train/cost.py): this process's rate, the whole run's time (resumes included).
    steps_per_s: float
    hours_per_million_steps: float | None
    peak_rss_mb: float
    cuda_peak_allocated_mb: float | None
    run_wall_s: float
    price_per_hour: float | None
    cost_usd: float | None
    usd_per_million_steps: float | None


def _versions() -> dict[str, str]:
    return {
        "sac_edge": sac_edge.__version__,
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


#: Both ways back into a run dir stopped before its first checkpoint (config.json only) say the same.
NO_CHECKPOINT = (
    f"the run stopped before its first checkpoint ({ckpt.CHECKPOINT}), so there is nothing to resume; "
    "pass --force to start it again"
)
#: The widest hidden layer accepted (a 65536 x 65536 fp32 layer is already 16 GiB).
MAX_WIDTH = 1 << 16


def resolve_config(cfg: TrainConfig) -> tuple[TrainConfig, Path]:
    """Validate the run dir against the flags; on --resume take the saved hyperparameters.

    Raises SacEdgeError before anything is written.
    """
    run = Path(cfg.out)
    check_values(cfg)
    check_output_path(run, "--out", directory=True)
    if not cfg.hidden or any(not 1 <= width <= MAX_WIDTH for width in cfg.hidden):
        shown = ",".join(map(str, cfg.hidden)) or "(empty)"
        raise SacEdgeError(f"--hidden needs one or more layer widths from 1 to {MAX_WIDTH}, got {shown}")
    has_run = (run / ckpt.CONFIG).exists() or (run / ckpt.CHECKPOINT).exists()
    if cfg.resume:
        saved = read_json(run / ckpt.CONFIG, "run config", "nothing to resume; train without --resume")
        fields = {f.name for f in dataclasses.fields(TrainConfig)}
        saved_cfg = {k: v for k, v in saved.items() if k in fields}
        hidden = saved_cfg.get("hidden", cfg.hidden)
        saved_cfg["hidden"] = tuple(hidden) if isinstance(hidden, (list, tuple)) else hidden
        if cfg.env is not None and cfg.env != saved_cfg.get("env"):
            raise SacEdgeError(
                f"{run} was trained on {saved_cfg.get('env')}, not {cfg.env}; "
                "resume without --env or choose another --out"
            )
        if cfg.env is None:  # the env a file names is never imported: only a registered id is taken from it
            file_env(saved_cfg.get("env"), str(run / ckpt.CONFIG))
        if not (run / ckpt.CHECKPOINT).exists():
            raise SacEdgeError(f"{run}: {NO_CHECKPOINT}")
        if isinstance(saved_cfg.get("compile"), bool):  # runs saved before --compile auto
            saved_cfg["compile"] = "on" if saved_cfg["compile"] else "off"
        keep = {*RESUME_TAKES, "resume"}
        dropped = resume_conflicts(cfg, saved_cfg, keep | {"env"})  # the env: said above
        if dropped:  # the same command line again passes; a changed setting would be replaced in silence
            raise SacEdgeError(
                f"--resume continues {run} with its settings, not {', '.join(dropped)}; drop them, or train a "
                "new run (another --out, or --force)"
            )
        resumed = dataclasses.replace(cfg, **{k: v for k, v in saved_cfg.items() if k not in keep})
        try:  # a saved value of the wrong type failed deep in torch after the envs and networks were built
            check_fields(resumed)
            check_values(resumed)
        except SacEdgeError as err:
            raise SacEdgeError(f"{run / ckpt.CONFIG} holds a setting no run can use ({err}); restore it") from None
        return resumed, run
    if has_run and not cfg.force and not (run / ckpt.CHECKPOINT).exists():  # --resume would refuse it
        raise SacEdgeError(f"{run}: {NO_CHECKPOINT}")
    if has_run and not cfg.force:
        raise SacEdgeError(f"{run} already holds a run; pass --resume to continue it or --force to replace it")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SacEdgeError("--device cuda but no CUDA device is available; use --device cpu")
    if cfg.num_envs < 1 or cfg.batch_size < 1 or cfg.total_steps < 1:
        raise SacEdgeError("--num-envs, --batch-size and --total-steps must be positive")
    return dataclasses.replace(cfg, env=cfg.env or "Pendulum-v1"), run


class Trainer:
    """Owns the envs, the learner and the run dir for one ``sac-train`` invocation."""

    def __init__(self, cfg: TrainConfig) -> None:
        cfg, self.run = resolve_config(cfg)
        self.device = torch.device(cfg.device)
        speed = resolve_speed(cfg, self.device)  # on --resume the saved choices, already resolved
        self.cfg = cfg = speed.cfg
        assert cfg.env is not None
        for reason in speed.reasons:  # beside the summary line (stderr under --json, which owns stdout)
            print(f"sac-train: {reason}", file=sys.stderr if cfg.json else sys.stdout)
        self.eval_env = make_env(cfg.env)  # fails fast with a one-line error on a bad id or space
        self.delay = self._delay()
        if self.delay is not None:  # evaluated under the delay it trains under
            self.eval_env = ActionDelay(self.eval_env, self.delay)
        self.envs = make_vector_env(cfg.env, cfg.num_envs, cfg.vector_mode, self.delay)
        frame_spec = policy_spec(cfg.env, self.envs, cfg.hidden)
        last = int(cfg.last_action) if self.delay is None else max(1, self.delay.largest)
        self.contract = ObsContract(frame_spec.obs_dim, frame_spec.act_dim, last, cfg.obs_history)
        # The networks take the assembled input; the env, the layout and the bounds describe the frame.
        self.spec: PolicySpec = dataclasses.replace(frame_spec, obs_dim=self.contract.obs_dim)
        self.history = None if self.contract.plain else self._assembler(cfg.num_envs)
        self.eval_env = policy_inputs(self.eval_env, self.contract)  # the inputs the runtime assembles
        self.choices = {**speed.choices, "threads": self._choose_threads()}  # before the learner: see there
        if cfg.device == "cpu" and cfg.amp == "bf16" and not cpu_bf16_flags():
            print(
                "sac-train: warning: this CPU has no bf16 matmul units (AVX512-BF16 or AMX), so --amp bf16 "
                "trains slower here than --amp off",
                file=sys.stderr,
            )
        self.sac = SAC(self.spec, cfg, self.device)
        self.np_rng = np.random.default_rng(cfg.seed)
        self.step = self.updates = self.episodes = 0
        self.ep_returns = np.zeros(cfg.num_envs)
        self.recent: list[float] = []
        self.last_eval: float | None = None
        self.last_good_step: int | None = None
        self.compile_s: float | None = None
        self.wall_before = 0.0  # the run's seconds before this process (up to the checkpoint resumed)
        obs, _ = self.envs.reset(seed=cfg.seed)
        self.frames = np.asarray(obs, dtype=np.float32)
        self.obs = self._policy_obs(self.frames)
        resume_step = self._load() if cfg.resume else None
        check_fits(cfg, self.step)
        enable_ranges(self.device.type == "cuda", nvtx=True)  # NVTX for Nsight Systems (nsys profile sac-train)
        if not cfg.resume and cfg.force and self.run.exists():
            shutil.rmtree(self.run)
        self.run.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self.metrics = MetricsLog(self.run, resume_step)
        if not cfg.resume and self.cfg.normalize_obs:
            self.sac.obs_norm.update(torch.as_tensor(self.obs, device=self.device))

    def _delay(self) -> DelayDistribution | None:
        """The action delay to train under (``--action-delay``, ``--delay-profile``; on ``--resume`` the run's
        record), said in one line with the last actions it turns on."""
        cfg = self.cfg
        saved = read_json(self.run / ckpt.CONFIG, "run config", "").get("delay") if cfg.resume else None
        if saved is not None:
            return DelayDistribution.from_dict(saved, str(self.run / ckpt.CONFIG))
        if cfg.action_delay:
            delay = parse_action_delay(cfg.action_delay)
        elif cfg.delay_profile:
            delay = delay_from_profile(cfg.delay_profile, env_dt(self.eval_env))
        else:
            return None
        shown = ", ".join(f"{s}: {p:.2f}" for s, p in zip(delay.steps, delay.probs))
        self._say(
            f"{delay.source} -> action delay in control steps (probability) {shown}, drawn per episode; "
            f"--last-action on: the policy sees the {max(1, delay.largest)} most recent actions"
        )
        return delay

    def _assembler(self, n: int) -> ObsAssembler:
        return ObsAssembler(self.contract, self.spec.action_low, self.spec.action_high, n)

    def _policy_obs(self, frames: np.ndarray) -> np.ndarray:
        """The policy's observations for the envs' current ``frames`` (the frames alone without a contract)."""
        return frames if self.history is None else self.history.assemble(frames).copy()

    def _choose_threads(self) -> dict[str, Any]:
        """The thread count (torch left at it; the probe reseeds torch, so this comes before the learner),
        the watch under ``--threads 0``, and ``config.json``'s record (on ``--resume`` with the record of the
        run before it as ``earlier``)."""
        cfg = self.cfg
        choice = choose_threads(cfg, self.spec, self.device)
        if cfg.threads == 0 or "warning" in choice.reason:
            self._say(choice.reason)
        self.thread_watch = ThreadWatch(choice.threads, choice.threads) if cfg.threads == 0 else None
        record = watched_record(choice.record, choice.threads) if self.thread_watch else choice.record
        earlier = _saved_threads(self.run) if cfg.resume else None
        return record if earlier is None else {**record, "earlier": earlier}

    def _say(self, line: str, flush: bool = False) -> None:
        """One log line (on stderr under --json, whose summary owns stdout)."""
        print(f"sac-train: {line}", file=sys.stderr if self.cfg.json else sys.stdout, flush=flush)

    # -- persistence ------------------------------------------------------------------------------
    def _write_config(self) -> None:
        """``config.json``, atomically: the resolved flags, the spec, versions and what auto chose on this
        machine and why (rewritten when the thread watch keeps a change)."""
        config = {**config_dict(self.cfg), "spec": self.spec.to_dict(), "versions": _versions()}
        if self.history is not None:
            config["observation"] = self.contract.to_dict()
        if self.delay is not None:
            config["delay"] = self.delay.to_dict()  # beside the flag's text, "action_delay"
        atomic_write_json(self.run / ckpt.CONFIG, {**config, "choices": self.choices})

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "updates": self.updates,
            "episodes": self.episodes,
            "episode_returns": self.ep_returns.tolist(),
            "recent_returns": self.recent,
            "last_eval": self.last_eval,
            "numpy_rng": self.np_rng.bit_generator.state,
            "env_state": env_state(self.envs),
            "obs": self.frames.tolist(),
            "obs_history": None if self.history is None else self.history.state(),
            "wall_s": self.wall_before + self._session_s(),
        }

    def save(self) -> None:
        """Checkpoint everything atomically (one file), then the readable copies beside it."""
        tensors, extra = self.sac.state_tensors()
        state = self._trainer_state()
        metadata = {"trainer_state": json.dumps(state), "learner_extra": json.dumps(extra), "format": "sac-edge/1"}
        ckpt.save_tensors(self.run / ckpt.CHECKPOINT, tensors, metadata)
        atomic_write_json(self.run / ckpt.TRAINER_STATE, {k: v for k, v in state.items() if k != "obs"})
        if self.sac.buffer.size:
            calib = self.sac.buffer.sample_observations(self.cfg.calib_states, np.random.default_rng(self.cfg.seed))
            with atomic_path(self.run / ckpt.CALIB_STATES) as tmp, open(tmp, "wb") as fh:
                np.save(fh, calib)
        self.last_good_step = self.step

    def _load(self) -> int:
        path = self.run / ckpt.CHECKPOINT
        tensors, meta = ckpt.read_checkpoint(path)
        try:
            state = json.loads(meta["trainer_state"])
            extra = json.loads(meta["learner_extra"])
            self.sac.load_state_tensors(tensors, extra)
        except (KeyError, ValueError, RuntimeError) as err:
            raise SacEdgeError(f"{path}: not a resumable sac-edge checkpoint ({err}); retrain with --force") from None
        self.step, self.updates, self.episodes = state["step"], state["updates"], state["episodes"]
        self.ep_returns = np.asarray(state["episode_returns"], dtype=np.float64)
        self.recent, self.last_eval = list(state["recent_returns"]), state["last_eval"]
        self.wall_before = float(state.get("wall_s", 0.0))
        self.np_rng.bit_generator.state = state["numpy_rng"]
        if state["env_state"] is None or not restore_env_state(self.envs, state["env_state"]):
            print("sac-train: warning: env state not restorable (async envs); episodes restart", file=sys.stderr)
        else:
            self.frames = np.asarray(state["obs"], dtype=np.float32)
            if self.history is not None:
                self.history.load_state(state["obs_history"])
            self.obs = self._policy_obs(self.frames)
        self.last_good_step = self.step
        return int(self.step)

    # -- the loop ---------------------------------------------------------------------------------
    def collect(self) -> None:
        """One vector step of every env: act (random before learning_starts), store, normalise, count."""
        cfg, spec = self.cfg, self.spec
        if self.step < cfg.learning_starts:
            action = self.np_rng.uniform(-1.0, 1.0, size=(cfg.num_envs, spec.act_dim)).astype(np.float32)
        else:
            action = self.sac.explore(self.obs)
        low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
        env_action = low + 0.5 * (action + 1.0) * (high - low)
        next_frames, reward, terminated, truncated, info = self.envs.step(env_action)
        next_frames = np.asarray(next_frames, dtype=np.float32)
        done = np.logical_or(terminated, truncated)
        real_next = next_frames.copy()
        if done.any():
            mask = info.get("_final_obs", done)
            for i in np.flatnonzero(mask):
                real_next[i] = info["final_obs"][i]
        if self.history is not None:  # the step's frame and the action sent join the history
            self.history.advance(self.frames, env_action)
            real_next = self._policy_obs(real_next)
            self.history.reset(done)
        next_obs = self._policy_obs(next_frames)
        self.sac.buffer.add(self.obs, action, reward, real_next, terminated.astype(np.float32))
        self.ep_returns += reward
        for i in np.flatnonzero(done):
            self.recent = [*self.recent, float(self.ep_returns[i])][-RECENT_EPISODES:]
            self.ep_returns[i] = 0.0
            self.episodes += 1
        self.obs, self.frames = next_obs, next_frames
        if cfg.normalize_obs:
            self.sac.obs_norm.update(torch.as_tensor(next_obs, device=self.device))
        self.step += cfg.num_envs

    def _evaluate(self) -> float:
        policy = InferencePolicy(
            self.sac.actor,
            self.sac.obs_norm,
            torch.tensor(self.spec.action_low, device=self.device),
            torch.tensor(self.spec.action_high, device=self.device),
        )
        with torch_threads(1):  # batch-1 acting: too little work per op to share, only barriers to wait at
            returns = evaluate(policy, self.eval_env, self.cfg.eval_episodes, self.cfg.seed + EVAL_SEED_OFFSET)
        return float(np.mean(returns))

    def train(self) -> TrainSummary:
        self._start = time.perf_counter()
        self._finite = torch.ones((), dtype=torch.bool, device=self.device)
        self._fast_ready = False
        self._compiled_at: dict[int, float] = {}  # thread counts the compiled update ran at: compile seconds
        self.monitor = IntervalMonitor(self.device, self.step)
        bar = self._progress_bar()
        try:
            with stop_on_signals() as self._stop:  # SIGINT/SIGTERM: stop at a step boundary, saved
                loop_s, uncounted = self._loop(bar)
        finally:
            bar.close()
            self.metrics.close()
            self.monitor.close()
            self.envs.close()
        if self._stop.signum is not None:
            raise Stopped(self._stop.signum, self.step, self.cfg.total_steps, self.run)
        return self._summary(loop_s, uncounted)

    def _progress_bar(self) -> tqdm:
        # Only on a terminal: a redirected log gets metrics.csv and the summary, not carriage-return noise.
        return tqdm(
            total=self.cfg.total_steps,
            initial=self.step,
            disable=not (self.cfg.progress and sys.stderr.isatty()),
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
        )

    def _loop(self, bar: tqdm) -> tuple[float, int]:
        """Collect and update up to --total-steps (or to the end of --profile), then checkpoint. Returns the
        seconds of collecting and updating in this process (no evaluations, no checkpoints) and the steps
        left out of the summary's rate (earlier sessions' and profiled ones)."""
        cfg = self.cfg
        uncounted, updates_at_start = self.step, self.updates
        loop_s = 0.0
        metrics = None
        while self.step < cfg.total_steps and self._stop.signum is None:
            before = self.step
            t0 = time.perf_counter()
            metrics = self._advance()[2] or metrics
            loop_s += time.perf_counter() - t0
            profiled = bool(cfg.profile) and self.updates - updates_at_start >= WARMUP_UPDATES
            if profiled:  # its steps run under the profiler: out of the summary's rate
                profiled_from = self.step
                metrics = self._profile() or metrics
                uncounted += self.step - profiled_from
            bar.update(self.step - before)
            self._log_and_checkpoint(before, metrics, bar, last=self.step >= cfg.total_steps or profiled)
            if profiled:
                break
        self._check_finite(self._finite)
        self.save()
        return loop_s, uncounted

    def _log_and_checkpoint(self, before: int, metrics: UpdateMetrics | None, bar: tqdm, last: bool) -> None:
        """After the steps from ``before``: a metrics row when one is due (with an evaluation when that is due
        too, and always at the ``last`` step), and a checkpoint when one is due."""
        cfg = self.cfg
        do_eval = cfg.eval_every > 0 and (_crossed(before, self.step, cfg.eval_every) or last)
        if do_eval or last or _crossed(before, self.step, cfg.log_every):
            self._check_finite(self._finite)
            row = self._row(metrics)
            if do_eval:
                self.last_eval = row["eval_return"] = self._evaluate()
            self.metrics.log(row)
            bar.set_postfix(ret=row["train_return"], ups=f"{row['updates_per_s'] or 0:.0f}", refresh=False)
        if cfg.checkpoint_every and _crossed(before, self.step, cfg.checkpoint_every):
            self._check_finite(self._finite)
            self.save()

    def _summary(self, loop_s: float, uncounted: int) -> TrainSummary:
        """The run's summary (and its cost line in the log) from ``_loop``'s seconds and uncounted steps."""
        monitor = self.monitor
        monitor.timer.drain()
        steps_per_s = (self.step - uncounted) / loop_s if loop_s > 0 else 0.0
        peak_rss = monitor.memory.read()[1]
        costs = cost_fields(steps_per_s, self.wall_before + self._session_s(), self.cfg.price_per_hour)
        self._say(cost_line(costs, peak_rss))
        return TrainSummary(
            str(self.run),
            self.step,
            self.updates,
            self.episodes,
            _rate(monitor.timer.total_updates, monitor.timer.total_s),
            self.last_eval,
            self._session_s(),
            self.compile_s,
            steps_per_s,
            costs["hours_per_million_steps"],
            round(peak_rss, 1),
            round(monitor.cuda_peak_allocated, 1) if self.device.type == "cuda" else None,
            round(self.wall_before + self._session_s(), 1),
            costs["price_per_hour"],
            costs["cost_usd"],
            costs["usd_per_million_steps"],
        )

    def _advance(self) -> tuple[float, float, UpdateMetrics | None]:
        """One vector step of collection and the updates it earns (none before --learning-starts): the
        seconds of each, and the last update's metrics."""
        cfg, timer = self.cfg, self.monitor.timer
        t0 = time.perf_counter()
        with phase("collect"):
            self.collect()
        t1 = time.perf_counter()
        metrics = None
        if self.step >= cfg.learning_starts:
            # A compiling update (the first, or the first at a thread count the compiled update has not run
            # at) says nothing of the thread count: the watch does not see it.
            warm = self._fast_ready and self._compiled_here()
            with phase("update"):
                for _ in range(cfg.num_envs * cfg.utd):
                    timer.start()
                    if not self._fast_ready:
                        metrics = self._first_step()
                    elif not self._compiled_here():
                        metrics = self._recompile_step()
                    else:
                        metrics = self.sac.step()
                    timer.stop()
                    self._fast_ready = True
                    self._finite &= metrics.finite
            self.updates += cfg.num_envs * cfg.utd
            if warm:
                self._watch_threads(cfg.num_envs * cfg.utd, time.perf_counter() - t1)
        return t1 - t0, time.perf_counter() - t1, metrics

    def _profile(self) -> UpdateMetrics | None:
        """``--profile``: the next ``cfg.profile`` updates (and their collection) under torch.profiler."""
        session, metrics, goal = ProfileSession(self.device), None, self.updates + self.cfg.profile
        with session.running():
            while self.updates < goal and self.step < self.cfg.total_steps:
                updates = self.updates
                collect_s, update_s, metrics = self._advance()
                session.add(collect_s, update_s, self.updates - updates)
        profile_report(session, self.run, to_stderr=self.cfg.json)
        return metrics

    def _session_s(self) -> float:
        """Seconds since this process started training (0 before)."""
        start = getattr(self, "_start", None)
        return 0.0 if start is None else time.perf_counter() - start

    def _first_step(self) -> UpdateMetrics:
        """The first update of this process: apply the fast path, and under ``--compile on`` log how long
        compiling took (the first compiled call; it counts in updates/s)."""
        self.sac.prepare_fast_path()
        t0 = time.perf_counter()
        metrics = self.sac.step()
        if self.cfg.compile == "on":
            self.compile_s = time.perf_counter() - t0
            self._compiled_at[torch.get_num_threads()] = round(self.compile_s, 2)
            print(
                f"sac-train: compiled the update in {self.compile_s:.1f} s",
                file=sys.stderr if self.cfg.json else sys.stdout,
            )
        return metrics

    def _compiled_here(self) -> bool:
        """Whether the update runs without compiling at torch's thread count now (always, uncompiled)."""
        return self.cfg.compile != "on" or torch.get_num_threads() in self._compiled_at

    def _recompile_step(self) -> UpdateMetrics:
        """The first compiled update at a thread count not run at before in this process (the thread watch
        moved it, or a caller did): compiled again once (the count is part of the compiled graph's guards;
        a count seen before reuses its graph), logged and timed in ``config.json``'s
        ``choices.threads.compile_s``, the cost of a thread change."""
        threads = torch.get_num_threads()
        t0 = time.perf_counter()
        metrics = self.sac.step()
        seconds = time.perf_counter() - t0
        self._compiled_at[threads] = round(seconds, 2)
        self._say(f"compiled the update again for {threads} threads in {seconds:.1f} s (a thread change)", flush=True)
        compile_s = {str(n): s for n, s in self._compiled_at.items()}
        self.choices["threads"] = {**self.choices["threads"], "compile_s": compile_s}
        self._write_config()
        return metrics

    def _watch_threads(self, updates: int, seconds: float) -> None:
        """Under ``--threads 0``: feed the watch; a kept change of thread count is one log line and one entry
        of ``choices.threads.changes`` in ``config.json``."""
        watch = self.thread_watch
        if watch is None or not (line := watch.observe(updates, seconds)):
            return
        self._say(line, flush=True)
        change = {**watch.changes[-1], "step": self.step, "wall_s": round(self.wall_before + self._session_s(), 1)}
        change["reason"] = line.partition(": ")[2]  # the log line without its "--threads auto: "
        self.choices["threads"] = with_change(self.choices["threads"], change, watch.threads)
        self._write_config()

    def _row(self, metrics: Any) -> dict[str, Any]:
        row: dict[str, Any] = {
            "step": self.step,
            "updates": self.updates,
            "episodes": self.episodes,
            "train_return": round(float(np.mean(self.recent)), 2) if self.recent else "",
            **self.monitor.row(self.step),
            "wall_s": round(self.wall_before + self._session_s(), 1),
        }
        eta = eta_s(self.cfg.total_steps - self.step, row["steps_per_s"] or 0.0)
        row["eta_s"] = "" if eta is None else round(eta, 3)
        if metrics is not None:
            row.update(
                critic_loss=float(metrics.critic_loss),
                actor_loss=float(metrics.actor_loss),
                alpha=float(metrics.alpha),
            )
        return row

    def _check_finite(self, finite: torch.Tensor) -> None:
        if not bool(finite):
            kept = f"step {self.last_good_step}" if self.last_good_step is not None else "none written yet"
            raise InternalError(
                f"non-finite loss before step {self.step}: training stopped; last good checkpoint in {self.run} "
                f"({kept}) kept; lower the learning rates or use --amp off"
            )


def _saved_threads(run: Path) -> Any:
    """The thread record in the run's ``config.json`` before this resume (None in a run saved without one)."""
    choices = read_json(run / ckpt.CONFIG, "run config", "nothing to resume; train without --resume").get("choices")
    return choices.get("threads") if isinstance(choices, dict) else None


def _rate(count: int, seconds: float) -> float:
    """Updates per second of update time (0 before the first update)."""
    return count / seconds if seconds > 0 else 0.0


def _crossed(before: int, after: int, every: int) -> bool:
    """True when a multiple of ``every`` lies in (before, after]."""
    return every > 0 and after // every > before // every
