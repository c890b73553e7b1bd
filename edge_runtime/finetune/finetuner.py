"""``sac-edge run --finetune``: learn on the device while the control loop runs, and swap weights in place.

The control thread only calls :meth:`FineTuner.explore` and :meth:`FineTuner.observe` (from
``Runtime.act`` and ``Runtime.observe``, whoever owns the loop): a noise add and a copy into a
preallocated staging ring in shared memory. The SAC updates run in a separate process
(``learner_process.py``: one torch thread, its own interpreter lock), and a light coordinator thread here
does the rest:

1. the learner process drains the ring into the replay buffer (train/buffer.py), earns update credit
   (``utd`` x the governor's ``update_rate_scale`` per new transition) and spends it on ``SAC.update``
   (train/sac.py) at the governor's ``finetune_batch`` unless the governor paused fine-tuning; the
   coordinator writes those knobs into shared memory;
2. every ``swap_every`` updates, once the last good weights have a full window of episodes, the learner
   checks its actor (losses finite, shadow check on recent states, promotion.py), re-quantises and
   re-checks it for int8 where an int8 backend is loaded (weight_swap.py), and publishes it as a
   candidate in shared memory with every backend's initializers; the coordinator copies them out and
   swaps them into every loaded backend (timed; an in-place refill for onnxruntime fp32 on the CPU);
3. after ``promotion_window`` episodes served entirely by the candidate, the coordinator promotes it
   (saved atomically as the last good weights: this process is the store's one writer) or rolls back to
   the last good weights (their sets, kept since they went live, swapped back), and tells the learner which.

Every decision is a ``{"type": "finetune", ...}`` telemetry record. A failure in the learner process or
the coordinator stops learning, puts the last good weights back, and is reported in the summary as one
line; the loop keeps running.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import typing
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import FINETUNE_DIR, LEARNER_KIND
from sac_edge.common.errors import SacEdgeError, one_line
from sac_edge.common.spec import PolicySpec
from sac_edge.edge_runtime.backends.base import Backend
from sac_edge.edge_runtime.budget.governor import Governor
from sac_edge.edge_runtime.budget.memory import MemoryProbe

from .experience import EpisodeLog, Exploration
from .learner_process import LearnerProcess
from .promotion import LastGood, LastGoodStore, PromotionRules, check_complete, judge
from .settings import FinetuneSection, FinetuneSettings
from .weight_swap import WeightSets, WeightSwapper

#: The interpreter's switch interval while fine-tuning runs: the longest the control thread waits for the
#: GIL the coordinator holds (see ``FineTuner.start``).
GIL_SWITCH_S = 1e-4
#: The coordinator wakes on a message from the learner or after this long (knobs, episodes, a dead child).
#: Each wake takes the GIL; at normal priority on a busy CPU a thread can be preempted while holding it,
#: and the control thread then waits for the scheduler, so it wakes rarely and waits without the GIL.
COORDINATOR_S = 0.05

Emit = typing.Callable[[typing.Dict[str, Any]], None]


def finetune_dir(section: FinetuneSection, bundle: str | Path) -> Path:
    """Where the last good weights of fine-tuning ``bundle`` live: ``--finetune-dir`` or ``BUNDLE/finetune``;
    the latter refused (one line) when it is a symlink or not a directory, since the weights and the lock
    would then be written wherever the bundle's author pointed it."""
    if section.finetune_dir:
        return Path(section.finetune_dir)
    path = Path(bundle) / FINETUNE_DIR
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        raise SacEdgeError(
            f"{path} is a symlink or not a directory; sac-edge writes fine-tuned weights only into a real "
            "BUNDLE/finetune: remove it, or pass --finetune-dir DIR"
        )
    return path


def install_last_good(swapper: WeightSwapper, last: LastGood) -> tuple[WeightSets, dict[str, Any]]:
    """Serve the resumed weights before the first step (int8 re-quantised here, before the loop starts, and
    re-checked on the states they were saved with): the sets installed and what to report."""
    bundle = swapper.bundle  # a tensor the last good set lacks would be served from the bundle: refused
    check_complete(last, read_learner_tensors(bundle) if bundle.files(LEARNER_KIND) else None, bundle.spec.obs_dim)
    sets = swapper.prepare(last.actor(), last.states if last.states.size > 0 else None)
    outcome = swapper.install(sets)
    if not outcome.live:
        raise SacEdgeError(
            f"the last good weights cannot be served at int8 ({outcome.reason}); run with --precision fp32"
        )
    return sets, {
        "sha256": last.sha256,
        "step": last.info.get("step"),
        "sidecar": last.info.get("sidecar"),
        **outcome.to_dict(),
    }


class FinetuneSummary(TypedDict):
    """What fine-tuning did, at any time (the ``finetune`` key of ``sac-edge run --json``)."""

    steps_collected: int
    """Transitions the learner process has taken from the ring."""
    dropped: int
    """Transitions dropped because the learner was a whole ring behind."""
    updates: int
    utd: float
    """Updates per collected step chosen at start-up."""
    achieved_utd: float
    candidates: int
    promotions: int
    rollbacks: int
    shadow_rejections: int
    int8_skipped: int
    nonfinite: int
    swaps: int
    swap_s: dict[str, dict[str, float]]
    """Per precision: p50, max (seconds) and count of the weight swaps."""
    episodes: int
    initial_mean_return: float | None
    last_good_mean_return: float | None
    last_good: str | None
    """The last good weights' file once a candidate was promoted in this run, else None."""
    last_good_sha256: str | None
    start_generation: int
    generation: int
    error: str | None
    """Why fine-tuning stopped early (the loop went on with the last good weights), else None."""
    sizing: dict[str, Any]


@dataclass
class Candidate:
    generation: int
    sets: WeightSets
    state: dict[str, np.ndarray]
    states: np.ndarray
    updates: int
    step: int
    returns: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class TunerParts:
    """What a ``FineTuner`` works with, built by ``build_finetuner``."""

    spec: PolicySpec
    learner: LearnerProcess
    swapper: WeightSwapper
    store: LastGoodStore
    """The fine-tuning directory's last good weights (its lock held by the caller)."""
    rules: PromotionRules
    cfg: FinetuneSettings
    governor: Governor | None
    """The budget governor (None without budgets); the tuner applies its fine-tuning knobs."""
    emit: Emit


@dataclass(frozen=True)
class StartingWeights:
    """The weights serving at the start (the bundle's, or with ``--resume`` the last good ones): the
    first last-good state a rollback returns to."""

    state: Mapping[str, np.ndarray]
    """The learner's tensors."""
    sets: WeightSets
    """The same, as the backends' weight sets."""
    states: np.ndarray
    """The shadow states the candidates' actions are compared on."""
    step: int = 0
    """The step count the resumed run had reached."""
    generation: int = 0
    """The promoted generations so far (a resumed run continues the count)."""


class FineTuner:
    """What the runtime's step feeds (``explore``, ``observe``), and the coordinator thread
    between the learner process and the backends."""

    def __init__(self, parts: TunerParts, start: StartingWeights) -> None:
        spec, learner, rules = parts.spec, parts.learner, parts.rules
        self.spec, self.learner, self.swapper, self.store, self.rules = spec, learner, parts.swapper, parts.store, rules
        self.cfg, self.governor, self._emit = parts.cfg, parts.governor, parts.emit
        cfg = parts.cfg
        good_state, good_sets, good_states = start.state, start.sets, start.states
        start_step, start_generation = start.step, start.generation
        self.ring = learner.ring
        self.sizing: dict[str, Any] = {k: v for k, v in learner.ready.items() if k not in ("kind", "torch_notes")}
        self.utd = float(self.sizing["utd"])
        self.episodes = EpisodeLog()
        self._explore = Exploration(
            cfg.section.explore_std, np.array(spec.action_low), np.array(spec.action_high), cfg.seed + 1
        )
        self.good_state = {k: np.array(v) for k, v in good_state.items()}
        self.good_sets = good_sets
        self.good_states = good_states
        self.start_generation = start_generation  # a resumed run continues the saved generation count
        self.good_generation = self.generation = start_generation
        self.episodes.generation = start_generation
        self.good_returns: deque[float] = deque(maxlen=rules.window)
        self.candidate: Candidate | None = None
        self.start_step = start_step
        self.counts = dict.fromkeys(
            ("candidates", "promotions", "rollbacks", "shadow_rejections", "int8_skipped", "nonfinite"), 0
        )
        self.swap_seconds: dict[str, list[float]] = {}
        self.episode_returns: list[tuple[int, float]] = []
        self.error: str | None = None
        self.last_good_sha: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sac-edge-finetune", daemon=True)
        self._t0 = time.monotonic()
        self._switch = sys.getswitchinterval()

    # -- the runtime's step (control thread) -----------------------------------------------------
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
        """Start the coordinator thread, with a short GIL switch interval while it runs.

        CPython lets a thread that wants the GIL wait up to the switch interval (5 ms by default) before it
        forces the holder to yield; with the coordinator copying out or swapping a candidate, the control
        thread would wake that late. ``GIL_SWITCH_S`` bounds that wait.
        """
        self._t0 = time.monotonic()
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, GIL_SWITCH_S))
        self._thread.start()

    def stop(self) -> None:
        """Stop the coordinator (if started) and the learner process, and unlink the shared memory."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
            sys.setswitchinterval(self._switch)
        self.learner.close()

    def event(self, kind: str, **fields: Any) -> None:
        self._emit({"type": "finetune", "event": kind, "t_s": round(time.monotonic() - self._t0, 3), **fields})

    # -- coordinator thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._send_knobs()
                for message in self.learner.messages(timeout=COORDINATOR_S):
                    self._on_message(message)
                self._review()
                failure = self.learner.failure()
                if failure is not None:
                    raise SacEdgeError(failure)
        except Exception as err:  # the loop keeps running on the last good weights; reported in the summary
            self.error = one_line(err)
            self.event("error", error=self.error)
            try:
                self.swapper.install(self.good_sets)
            except Exception as again:  # nothing more to do than report it
                self.error += f"; restoring the last good weights failed too ({type(again).__name__})"

    def _send_knobs(self) -> None:
        knobs = self.governor.knobs if self.governor is not None else None
        window_ok = self.candidate is None and len(self.good_returns) >= self.rules.window
        if knobs is None or knobs.finetune_batch is None:
            self.learner.set_knobs(1.0, int(self.sizing["batch_size"]), False, window_ok)
        else:
            self.learner.set_knobs(knobs.update_rate_scale, knobs.finetune_batch, knobs.finetune_paused, window_ok)

    def _on_message(self, message: Mapping[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "error":
            raise SacEdgeError(f"the learner process failed: {message.get('error')}")
        if kind == "candidate":
            self._on_candidate(message)
        elif kind == "event":  # rejected in the learner before serving (non-finite losses, shadow or int8 check)
            self.counts["candidates"] += 1
            self.counts[str(message["counter"])] += 1
            fields = {k: v for k, v in message.items() if k in ("reason", "shadow", "int8")}
            event = str(message.get("event", "reject"))
            self.event(event, step=self.start_step + int(message["collected"]), **fields)

    def _on_candidate(self, message: Mapping[str, Any]) -> None:
        """The learner published a candidate that passed every check: swap its sets in."""
        self.counts["candidates"] += 1
        step = self.start_step + int(message["collected"])
        state, int8, states = self.learner.candidate()
        sets = WeightSets(_actor(state), int8, message.get("int8"))
        outcome = self.swapper.install(sets)
        if not outcome.live:  # the learner checked it; a candidate failing here is a broken protocol
            raise SacEdgeError("the learner process published a candidate that failed its int8 check")
        self._published(outcome.seconds)
        self.candidate = Candidate(self.generation, sets, state, states, int(message["updates"]), step)
        self.event(
            "swap",
            generation=self.generation,
            updates=int(message["updates"]),
            step=step,
            shadow=message.get("shadow"),
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
        scores = {
            "candidate_mean": verdict.candidate_mean,
            "good_mean": verdict.good_mean,
            "allowed_drop": verdict.allowed_drop,
            "noise_se": verdict.noise_se,
        }
        if verdict.regressed:
            outcome = self.swapper.install(self.good_sets)
            self._published(outcome.seconds)
            self.good_generation = self.generation
            self.learner.resolve("rollback")
            self.counts["rollbacks"] += 1
            self.event("rollback", generation=cand.generation, step=cand.step, **scores, swap_s=outcome.seconds)
            return
        self.good_state, self.good_sets, self.good_states = cand.state, cand.sets, cand.states
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
        self.learner.resolve("promote")
        self.counts["promotions"] += 1
        self.event("promote", generation=cand.generation, step=cand.step, **scores, sha256=self.last_good_sha)

    # -- report -----------------------------------------------------------------------------------
    def summary(self) -> FinetuneSummary:
        first = [r for g, r in self.episode_returns if g == self.start_generation][: self.rules.window]
        collected, updates = self.learner.collected, self.learner.updates
        counts = self.counts
        return FinetuneSummary(
            steps_collected=collected,
            dropped=self.ring.dropped,
            updates=updates,
            utd=self.utd,
            achieved_utd=updates / collected if collected else 0.0,
            candidates=counts["candidates"],
            promotions=counts["promotions"],
            rollbacks=counts["rollbacks"],
            shadow_rejections=counts["shadow_rejections"],
            int8_skipped=counts["int8_skipped"],
            nonfinite=counts["nonfinite"],
            swaps=sum(len(v) for v in self.swap_seconds.values()),
            swap_s={
                p: {"p50": float(np.median(v)), "max": float(np.max(v)), "n": len(v)}
                for p, v in self.swap_seconds.items()
            },
            episodes=len(self.episode_returns),
            initial_mean_return=float(np.mean(first)) if first else None,
            last_good_mean_return=float(np.mean(self.good_returns)) if self.good_returns else None,
            last_good=str(self.store.path) if self.last_good_sha else None,
            last_good_sha256=self.last_good_sha,
            start_generation=self.start_generation,
            generation=self.good_generation,
            error=self.error,
            sizing=self.sizing,
        )


def _actor(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The actor's tensors of a learner state (keyed as the ONNX initializers, ``actor.*``)."""
    return {k: v for k, v in state.items() if k.startswith("actor.")}


def read_learner_tensors(bundle: Bundle) -> dict[str, np.ndarray]:
    """The bundle's ``learner.safetensors`` as numpy arrays (the learner process gets them by shared memory)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    names = bundle.files(LEARNER_KIND)
    if not names:
        raise SacEdgeError(f"{bundle.path}: --finetune needs learner.safetensors, which the bundle lacks")
    path = bundle.path / names[0]
    try:
        return load(bundle.read(path))  # the verified bytes
    except (SafetensorError, OSError, ValueError) as err:
        raise SacEdgeError(f"{path}: learner tensors are corrupt or truncated ({err}); re-export the bundle") from None


@dataclass(frozen=True)
class TunerSetup:
    """What :func:`build_finetuner` makes a tuner from (``sac-edge run --finetune``'s composition)."""

    cfg: FinetuneSettings
    bundle: Bundle
    backends: Mapping[str, Backend]
    """Every loaded backend: each swap goes into all of them."""
    probe: MemoryProbe
    """This process's memory reader; it follows the learner process too."""
    last: LastGood | None = None
    """With ``--resume``: the last good weights to start from (None: the bundle's)."""
    rules: PromotionRules | None = None
    """The promotion rules; None: ``cfg``'s."""
    governor: Callable[[int], Governor | None] | None = None
    """Makes the budget governor from the fine-tuning batch the learner chose (None: no governor)."""
    listeners: Sequence[Callable[[], None]] = ()
    """Called after each swap that went live (the shield's ramp)."""
    store: LastGoodStore | None = None
    """The fine-tuning directory's store, its lock held by the caller (None: one for ``cfg``'s directory)."""


def build_finetuner(
    setup: TunerSetup, emit: Emit, log: Callable[[str], None]
) -> tuple[FineTuner, dict[str, Any] | None]:
    """Install the starting weights, start the learner process (which imports torch and sizes itself from
    the memory budget and this process's baseline), and make the tuner; also what ``--resume`` restored."""
    if importlib.util.find_spec("torch") is None:
        raise SacEdgeError("--finetune needs the Python package 'torch' (the inference-only path does not)")
    cfg, last = setup.cfg, setup.last
    tensors = dict(last.tensors) if last is not None else read_learner_tensors(setup.bundle)
    rules = setup.rules if setup.rules is not None else cfg.section.rules()  # checked before the learner starts
    swapper = WeightSwapper(setup.backends, setup.bundle, setup.listeners)
    start, resumed = _starting_weights(swapper, tensors, last)
    learner = _start_learner(setup, start)
    try:
        budget = setup.governor(int(learner.ready["batch_size"])) if setup.governor is not None else None
        store = setup.store if setup.store is not None else LastGoodStore(finetune_dir(cfg.section, cfg.bundle))
        tuner = FineTuner(TunerParts(setup.bundle.spec, learner, swapper, store, rules, cfg, budget, emit), start)
    except BaseException:
        learner.close()
        raise
    for note in learner.ready.get("torch_notes", []):  # what this torch lacks, switched off (train/compat.py)
        log(f"fine-tune: {note}")
    tuner.event("sizing", **tuner.sizing, resumed=resumed)
    log(
        f"fine-tune sizing: {tuner.sizing['buffer_rows']} rows, batch {tuner.sizing['batch_size']}, "
        f"checkpointing {tuner.sizing['grad_checkpoint']}, "
        f"utd {tuner.utd:g} ({'; '.join(tuner.sizing['reasons'])}); learner process {learner.process.pid}"
    )
    return tuner, resumed


def _starting_weights(
    swapper: WeightSwapper, tensors: dict[str, np.ndarray], last: LastGood | None
) -> tuple[StartingWeights, dict[str, Any] | None]:
    """Serve ``last`` (and say what was restored) or the bundle's own ``tensors``, warm the swap path, and
    return what the tuner starts from."""
    if last is not None:
        sets, resumed = install_last_good(swapper, last)
        info = last.info
        start = StartingWeights(tensors, sets, last.states, int(info.get("step", 0)), int(info.get("generation", 0)))
    else:  # the bundle's own weights: checks the graph names them like the learner
        sets, resumed = swapper.prepare(_actor(tensors), None), None
        swapper.install(sets)
        start = StartingWeights(tensors, sets, np.zeros((0, swapper.bundle.spec.obs_dim), np.float32))
    swapper.warm_up(sets)
    return start, resumed


def _start_learner(setup: TunerSetup, start: StartingWeights) -> LearnerProcess:
    """The learner process on ``start``'s tensors, its memory followed by the probe."""
    settings = {
        "main_baseline_mb": setup.probe.read().budget_mb,  # everything but the learner: backends, env, swap path
        "bundle": str(setup.bundle.path),
        "manifest": setup.bundle.manifest,  # the child re-checks that it re-quantises with the files opened here
        "finetune": setup.cfg.to_json(),  # the section itself, as JSON: the child rebuilds the same dataclass
    }
    learner = LearnerProcess(setup.bundle.spec, start.state, start.sets.int8, settings)
    setup.probe.follow(learner.process.pid)  # the governor's memory reading includes the learner's
    return learner
