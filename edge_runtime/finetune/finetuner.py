"""``sac-edge run --finetune``: learn on the device while the control loop runs, and swap weights in place.

The control thread only calls :meth:`FineTuner.explore` and :meth:`FineTuner.observe` (the loop's
``Experience`` hook): a noise add and a copy into a preallocated staging ring. Everything else runs in
one learner thread with one torch intra-op thread (torch releases the GIL inside its kernels, so the loop
keeps running between them):

1. drain the ring into the replay buffer (train/buffer.py) and earn update credit: ``utd`` x the
   governor's ``update_rate_scale`` per new transition;
2. spend credit on ``SAC.update`` (train/sac.py) at the governor's ``finetune_batch`` unless the governor
   paused fine-tuning;
3. every ``swap_every`` updates, once the last good weights have a full window of episodes, propose the
   actor as a candidate: losses finite, shadow check on recent states (promotion.py), int8 re-quantisation
   and re-check (weight_swap.py), then swap it into every loaded backend (timed);
4. after ``promotion_window`` episodes served entirely by the candidate, promote it (saved atomically as
   the last good weights) or roll back to the last good weights (swapped back, learner actor reset).

Every decision is a ``{"type": "finetune", ...}`` telemetry record. A failure in the learner thread stops
learning, puts the last good weights back, and is reported in the summary; the loop keeps running.
"""

from __future__ import annotations

import sys
import threading
import time
import typing
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import FINETUNE_DIR
from sac_edge.common.spec import PolicySpec
from sac_edge.edge_runtime.backends.base import Backend, Bundle
from sac_edge.edge_runtime.budget.governor import Governor
from sac_edge.edge_runtime.budget.memory import MemoryProbe

from .experience import EpisodeLog, Exploration, StagingRing
from .promotion import LastGood, LastGoodStore, PromotionRules, judge, shadow_check
from .settings import FinetuneSettings
from .sizing import choose_sizing, choose_utd
from .weight_swap import WeightSwapper

SHADOW_STATES = 512
STAGING_ROWS = 8192
IDLE_S = 0.002
GIL_SWITCH_S = 1e-4

Emit = typing.Callable[[typing.Dict[str, Any]], None]


def finetune_dir(cfg: FinetuneSettings) -> Path:
    """Where the last good weights live: ``--finetune-dir`` or ``BUNDLE/finetune``."""
    return Path(cfg.finetune_dir) if cfg.finetune_dir else Path(cfg.bundle) / FINETUNE_DIR


def install_last_good(swapper: WeightSwapper, last: LastGood) -> dict[str, Any]:
    """Serve the resumed weights before the first step (int8 re-checked on the states they were saved with)."""
    check = last.states.size > 0
    outcome = swapper.push(last.actor(), last.states, check=check)
    if not outcome.live:
        raise SacEdgeError(
            f"the last good weights cannot be served at int8 ({outcome.reason}); run with --precision fp32"
        )
    return {
        "sha256": last.sha256,
        "step": last.info.get("step"),
        "sidecar": last.info.get("sidecar"),
        **outcome.to_dict(),
    }


@dataclass
class Candidate:
    generation: int
    weights: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    states: np.ndarray
    updates: int
    step: int
    returns: list[float] = field(default_factory=list)


class FineTuner:
    """The ``Experience`` the loop feeds, and the learner thread behind it."""

    def __init__(
        self,
        spec: PolicySpec,
        learner: Any,
        swapper: WeightSwapper,
        store: LastGoodStore,
        rules: PromotionRules,
        cfg: FinetuneSettings,
        utd: float,
        governor: Governor | None,
        emit: Emit,
        good_state: Mapping[str, np.ndarray],
        good_states: np.ndarray,
        start_step: int = 0,
        start_generation: int = 0,
    ) -> None:
        self.spec, self.learner, self.swapper, self.store, self.rules = spec, learner, swapper, store, rules
        self.cfg, self.utd, self.governor, self._emit = cfg, utd, governor, emit
        self.ring = StagingRing(
            STAGING_ROWS, spec.obs_dim, spec.act_dim, np.array(spec.action_low), np.array(spec.action_high)
        )
        self.episodes = EpisodeLog()
        self._explore = Exploration(
            cfg.explore_std, np.array(spec.action_low), np.array(spec.action_high), cfg.seed + 1
        )
        self.good_state = {k: np.array(v) for k, v in good_state.items()}
        self.good_weights = {k: v for k, v in self.good_state.items() if k.startswith("actor.")}
        self.good_states = good_states
        self.start_generation = start_generation  # a resumed run continues the saved generation count
        self.good_generation = self.generation = start_generation
        self.episodes.generation = start_generation
        self.good_returns: deque[float] = deque(maxlen=rules.window)
        self.candidate: Candidate | None = None
        self.start_step = start_step
        self.collected = self.updates = self._since = 0
        self.credit = 0.0
        self.counts = dict.fromkeys(
            ("candidates", "promotions", "rollbacks", "shadow_rejections", "int8_skipped", "nonfinite"), 0
        )
        self.swap_seconds: dict[str, list[float]] = {}
        self.episode_returns: list[tuple[int, float]] = []
        self.error: str | None = None
        self.last_good_sha: str | None = None
        self._metrics: Any = None
        self.sizing: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sac-edge-learner", daemon=True)
        self._t0 = time.monotonic()
        self._switch = sys.getswitchinterval()

    # -- the loop's Experience hook (control thread) ---------------------------------------------
    def explore(self, action: np.ndarray) -> np.ndarray:
        return self._explore(action)

    def observe(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        self.ring.push(obs, action, reward, next_obs, terminated)
        self.episodes.step(reward, terminated or truncated)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the learner thread, with a short GIL switch interval while it runs.

        CPython lets a thread that wants the GIL wait up to the switch interval (5 ms by default) before it
        forces the holder to yield; with the learner between torch kernels holding it, the control thread
        would wake that late. ``GIL_SWITCH_S`` bounds that wait.
        """
        self._t0 = time.monotonic()
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, GIL_SWITCH_S))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        sys.setswitchinterval(self._switch)

    def event(self, kind: str, **fields: Any) -> None:
        self._emit({"type": "finetune", "event": kind, "t_s": round(time.monotonic() - self._t0, 3), **fields})

    # -- learner thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._ingest()
                self._review()
                if not self._learn_once():
                    self._stop.wait(IDLE_S)
        except Exception as err:  # the loop keeps running on the last good weights; reported in the summary
            self.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            self.event("error", error=self.error)
            try:
                self.swapper.push(self.good_weights, self.good_states, check=False)
            except Exception as again:  # nothing more to do than report it
                self.error += f"; restoring the last good weights failed too ({type(again).__name__})"

    def _knobs(self) -> tuple[float, int, bool]:
        knobs = self.governor.knobs if self.governor is not None else None
        if knobs is None or knobs.finetune_batch is None:
            return 1.0, self.learner.sizing.batch_size, False
        return knobs.update_rate_scale, knobs.finetune_batch, knobs.finetune_paused

    def _ingest(self) -> None:
        chunk = self.ring.drain()
        if chunk is None:
            return
        n = len(chunk.rewards)
        self.learner.add(chunk)
        self.collected += n
        scale, _, _ = self._knobs()
        self.credit = min(self.credit + n * self.utd * scale, float(self.cfg.swap_every))

    def _learn_once(self) -> bool:
        _, batch, paused = self._knobs()
        if paused or self.learner.rows < self.cfg.learning_starts or self.credit < 1.0:
            return False
        self._metrics = self.learner.update(batch)
        self.updates += 1
        self._since += 1
        self.credit -= 1.0
        if (
            self._since >= self.cfg.swap_every
            and self.candidate is None
            and len(self.good_returns) >= self.rules.window
        ):
            self._since = 0
            self._propose()
        return True

    def _propose(self) -> None:
        self.counts["candidates"] += 1
        step = self.start_step + self.collected
        if not bool(self._metrics.finite):
            self.counts["nonfinite"] += 1
            self.learner.load(_torch_tensors(self.good_state))
            self.event("reject", reason="non-finite losses; learner reset to the last good weights", step=step)
            return
        weights = self.learner.actor_weights()
        states = self.learner.recent_states(SHADOW_STATES)
        shadow = shadow_check(
            self.learner.actions(weights, states),
            self.learner.actions(self.good_weights, states),
            self.spec.action_low,
            self.spec.action_high,
            self.rules.shadow_max_diff,
        )
        if not shadow.ok:
            self.counts["shadow_rejections"] += 1
            self.learner.load_actor(self.good_weights)
            self.event("reject", reason=f"shadow check: {shadow.reason}", step=step, shadow=shadow._asdict())
            return
        outcome = self.swapper.push(weights, states)
        if not outcome.live:
            self.counts["int8_skipped"] += 1
            self.event(
                "skip",
                reason=f"{outcome.reason}; candidate skipped, serving the last good weights",
                step=step,
                int8=outcome.int8,
            )
            return
        self._published(outcome.seconds)
        self.candidate = Candidate(self.generation, weights, _numpy(self.learner.state()), states, self.updates, step)
        self.event(
            "swap",
            generation=self.generation,
            updates=self.updates,
            step=step,
            shadow=shadow._asdict(),
            **outcome.to_dict(),
        )

    def _published(self, seconds: Mapping[str, float]) -> None:
        """A new weight set is live everywhere: episodes starting from now belong to a new generation."""
        for precision, s in seconds.items():
            self.swap_seconds.setdefault(precision, []).append(s)
        self.generation += 1
        self.episodes.generation = self.generation

    def _review(self) -> None:
        finished = self.episodes.finished
        while finished:
            rec = finished.popleft()
            self.episode_returns.append((rec.generation, rec.total_return))
            if not rec.whole:
                continue
            if rec.generation == self.good_generation:
                self.good_returns.append(rec.total_return)
            elif self.candidate is not None and rec.generation == self.candidate.generation:
                self.candidate.returns.append(rec.total_return)
        cand = self.candidate
        if cand is None or len(cand.returns) < self.rules.window:
            return
        self.candidate = None
        verdict = judge(cand.returns, list(self.good_returns), self.rules.rollback_threshold, self.rules.noise_z)
        figures = {
            "candidate_mean": verdict.candidate_mean,
            "good_mean": verdict.good_mean,
            "allowed_drop": verdict.allowed_drop,
            "noise_se": verdict.noise_se,
        }
        if verdict.regressed:
            outcome = self.swapper.push(self.good_weights, self.good_states, check=False)
            self._published(outcome.seconds)
            self.good_generation = self.generation
            self.learner.load_actor(self.good_weights)
            self._since = 0  # the next candidate gets a full swap_every updates from the last good weights
            self.counts["rollbacks"] += 1
            self.event("rollback", generation=cand.generation, step=cand.step, **figures, swap_s=outcome.seconds)
            return
        self.good_state, self.good_weights, self.good_states = cand.state, cand.weights, cand.states
        self.good_generation = cand.generation
        self.good_returns = deque(cand.returns, maxlen=self.rules.window)
        info = {
            "step": cand.step,
            "updates": cand.updates,
            "generation": cand.generation,
            "returns": cand.returns,
            "mean_return": verdict.candidate_mean,
            "env": self.cfg.env,
            "bundle": str(self.cfg.bundle),
        }
        self.last_good_sha = self.store.save(cand.state, cand.states, info)
        self.counts["promotions"] += 1
        self.event("promote", generation=cand.generation, step=cand.step, **figures, sha256=self.last_good_sha)

    # -- report -----------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        first = [r for g, r in self.episode_returns if g == self.start_generation][: self.rules.window]
        return {
            "steps_collected": self.collected,
            "dropped": self.ring.dropped,
            "updates": self.updates,
            "utd": self.utd,
            "achieved_utd": self.updates / self.collected if self.collected else 0.0,
            **self.counts,
            "swaps": sum(len(v) for v in self.swap_seconds.values()),
            "swap_s": {
                p: {"p50": float(np.median(v)), "max": float(np.max(v)), "n": len(v)}
                for p, v in self.swap_seconds.items()
            },
            "episodes": len(self.episode_returns),
            "initial_mean_return": float(np.mean(first)) if first else None,
            "last_good_mean_return": float(np.mean(self.good_returns)) if self.good_returns else None,
            "last_good": str(self.store.path) if self.last_good_sha else None,
            "last_good_sha256": self.last_good_sha,
            "start_generation": self.start_generation,
            "generation": self.good_generation,
            "error": self.error,
            "sizing": self.sizing,
        }


def _numpy(tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in tensors.items()}


def _torch_tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(np.array(v)) for k, v in arrays.items()}


def build_finetuner(
    cfg: FinetuneSettings,
    bundle: Bundle,
    backends: Mapping[str, Backend],
    probe: MemoryProbe,
    last: LastGood | None,
    emit: Emit,
    log: Callable[[str], None],
) -> tuple[FineTuner, dict[str, Any] | None]:
    """Size and build the learner (torch is imported here), install the starting weights, make the tuner."""
    try:
        import torch
    except ImportError:
        raise SacEdgeError("--finetune needs the Python package 'torch' (the inference-only path does not)") from None
    from sac_edge.train import compat
    from sac_edge.train.checkpoint import load_tensors

    for note in compat.notes():
        log(f"fine-tune: {note}")

    from .learner import DeviceLearner, net_shape, warm_up_math

    spec = bundle.spec
    if last is not None:
        tensors = _torch_tensors(last.tensors)
    else:
        names = bundle.files("learner")
        if not names:
            raise SacEdgeError(f"{bundle.path}: --finetune needs learner.safetensors, which the bundle lacks")
        tensors = load_tensors(bundle.path / names[0], "learner tensors")
    rules = PromotionRules(cfg.promotion_window, cfg.rollback_threshold, cfg.shadow_max_diff, cfg.rollback_noise_z)
    torch.set_num_threads(1)
    swapper = WeightSwapper(backends, bundle)
    states = last.states if last is not None else np.zeros((0, spec.obs_dim), np.float32)
    if last is not None:
        resumed: dict[str, Any] | None = install_last_good(swapper, last)
        start_weights = last.actor()
    else:  # the bundle's own weights: checks the graph names them like the learner
        resumed = None
        start_weights = {k: v.detach().numpy().copy() for k, v in tensors.items() if k.startswith("actor.")}
        swapper.push(start_weights, states, check=False)
    swapper.warm_up(start_weights, SHADOW_STATES)
    warm_up_math(spec)
    baseline = probe.read().budget_mb  # everything but the learner: torch, backends, env, the swap path
    sizing = choose_sizing(
        net_shape(spec, tensors),
        rows=cfg.finetune_buffer,
        batch=cfg.finetune_batch,
        staging=STAGING_ROWS,
        min_rows=max(cfg.learning_starts, 1000),
        budget_mb=cfg.mem_budget_mb,
        baseline_mb=baseline,
    )
    learner = DeviceLearner(spec, tensors, sizing, cfg.finetune_lr, cfg.seed)
    utd, utd_reason = choose_utd(cfg.finetune_utd, learner.update_seconds, cfg.rate_hz, cfg.learner_cpu)
    state = _numpy(learner.state())
    tuner = FineTuner(
        spec,
        learner,
        swapper,
        LastGoodStore(finetune_dir(cfg)),
        rules,
        cfg,
        utd,
        None,
        emit,
        state,
        states,
        start_step=int(last.info.get("step", 0)) if last is not None else 0,
        start_generation=int(last.info.get("generation", 0)) if last is not None else 0,
    )
    tuner.sizing = {
        **sizing.to_dict(),
        "utd": utd,
        "update_ms": round(learner.update_seconds * 1e3, 3),
        "reasons": [*sizing.reasons, utd_reason],
    }
    tuner.event("sizing", **tuner.sizing, resumed=resumed)
    log(
        f"fine-tune sizing: {sizing.buffer_rows} rows, batch {sizing.batch_size}, "
        f"checkpointing {sizing.grad_checkpoint}, "
        f"utd {utd:g} ({'; '.join(tuner.sizing['reasons'])})"
    )
    return tuner, resumed
