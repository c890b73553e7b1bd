"""The learner in its own process, so that SAC updates never hold the control thread's GIL.

With the learner as a thread, every update held the one interpreter lock between torch kernels, and the
control thread, woken for its slot, waited for it; on a loaded CPU the holder could be preempted while
holding it, and the control thread waited for the scheduler (measured: BENCHMARKS.md, "Edge: fine-tuning
beside the 1 kHz loop"). Here the main process keeps everything the control path and the safety rules need
(the staging ring's producer, the weight swap into its backends, promotion and the last good store, the one
writer), and a ``spawn`` child (``serve``) imports torch and runs ``DeviceLearner``, and makes each
candidate's int8 weights (``weight_swap.weight_sets``: re-quantisation and the action-error check, which
held the control process's interpreter lock for milliseconds a candidate when they ran there; BENCHMARKS.md,
"Edge: weight swaps out of the control process"):

- experience: the ``StagingRing`` rows live in shared memory; the control thread's ``observe`` copies a
  transition in, and the child drains the rows into its replay buffer;
- weights: one shared block holds a full learner state, the int8 backends' re-quantised initializers
  (``INT8`` + name; laid out from the starting weights' set) and the recent states a candidate was checked
  on (``weights``); the main process writes the starting tensors before the child starts, the child writes
  each candidate that passed its checks and then says so on the pipe (with the int8 check's result); it writes
  nothing more until the main process resolves that candidate, so the main process copies out a whole set
  and swaps it in. A candidate that fails the int8 check never reaches the block: the child reports it as
  an ``event`` (``int8_skipped``) and learns on. The child does not write into the arrays the serving
  onnxruntime session reads (``backends/onnxrt/runner.py``), though that would save one copy (small
  beside the swap itself): when the retired generation may be written is
  known only in the control process (its ``act`` counters), and the control process stays the only one
  that changes what a backend serves, so a rollback or a failed child can never leave a half-written set;
- control: a small shared block carries the governor's knobs (rate scale, batch, pause), whether the last
  good weights have a full window of episodes, the stop flag and the child's counters;
- messages: JSON over a ``multiprocessing`` pipe (never pickle): ``ready`` (sizing), ``candidate``,
  ``event`` (a candidate rejected before serving), ``error`` (one line); back: ``resolve`` (``promote``
  or ``rollback``), after which the child may propose again.

The child is started with the caller's ``__main__`` hidden (``_callers_main_hidden``): a ``spawn`` child
would otherwise re-run the caller's script, which a robot script without ``if __name__ == "__main__":``
does not survive. The blocks are reserved in ``/dev/shm`` when created (``shared.py``), after a check that
they fit. The child runs on the CPUs that ``--cpus`` leaves to others (all of them without ``--cpus``). It
dies with its parent: it is a daemon process, asks the kernel for SIGKILL when the parent dies
(``PR_SET_PDEATHSIG``, Linux) and checks its parent's pid on every iteration; it ignores SIGINT/SIGTERM,
which the main process handles by stopping it. The main process unlinks every block it created.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sac_edge.common.bundle import reopen_bundle
from sac_edge.common.errors import SacEdgeError, one_line
from sac_edge.common.spec import PolicySpec
from sac_edge.edge_runtime.budget.memory import read_process_memory

from .experience import StagingRing, ring_layout
from .promotion import MAX_STATES, shadow_check
from .settings import MIN_FINETUNE_ROWS, FinetuneSettings
from .shared import Layout, SharedArrays, block_bytes, check_shm_space, layout_of
from .weight_swap import Int8Requantizer, weight_sets

STAGING_ROWS = 8192
SHADOW_STATES = MAX_STATES  # what a candidate is checked on, and a last good file holds at most
IDLE_S = 0.002
START_TIMEOUT_S = 300.0  # torch import, sizing and timed updates on a slow device
STOP_TIMEOUT_S = 10.0
STATES, N_STATES = "__shadow_states__", "__n_states__"
INT8 = "int8/"  # prefix of the re-quantised initializers in the weights block
# control block: knobs (float64) and flags (int64)
SCALE, BATCH, PAUSED = range(3)
STOP, WINDOW_OK, COLLECTED, UPDATES = range(4)
CONTROL_LAYOUT = [("knobs", np.dtype(np.float64).str, (3,)), ("flags", np.dtype(np.int64).str, (4,))]
PR_SET_PDEATHSIG = 1


def weights_layout(
    spec: PolicySpec, tensors: Mapping[str, np.ndarray], int8: Mapping[str, np.ndarray]
) -> list[tuple[str, str, tuple[int, ...]]]:
    """The weights block: the learner state, the int8 initializers (``INT8`` + name) and the checked states."""
    return [
        *layout_of(tensors),
        *layout_of({INT8 + k: v for k, v in int8.items()}),
        (STATES, np.dtype(np.float32).str, (SHADOW_STATES, spec.obs_dim)),
        (N_STATES, np.dtype(np.int64).str, ()),
    ]


def read_candidate(
    weights: SharedArrays, tensor_names: list[str], int8_names: list[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Copies of a candidate's learner state, int8 initializers (names without ``INT8``) and checked states."""
    n = int(weights[N_STATES])
    int8 = {k[len(INT8) :]: v for k, v in weights.copy(int8_names).items()}
    return weights.copy(tensor_names), int8, weights[STATES][:n].copy()


def _send(conn: Any, message: Mapping[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, default=float).encode())


class LearnerProcess:
    """The main process's handle: the shared blocks, the pipe and the child (started by ``__init__``,
    which returns once the child has sized and timed its learner). ``int8``: the starting weights'
    re-quantised initializers (empty without an int8 backend), which lay out the candidates' ones."""

    def __init__(
        self,
        spec: PolicySpec,
        tensors: Mapping[str, np.ndarray],
        int8: Mapping[str, np.ndarray],
        settings: Mapping[str, Any],
    ) -> None:
        ctx = mp.get_context("spawn")
        self.tensor_names = list(tensors)
        self.int8_names = [INT8 + k for k in int8]
        self.process: Any = None
        self.conn: Any = None
        self._blocks: list[SharedArrays] = []
        layouts: list[Layout] = [
            ring_layout(STAGING_ROWS, spec.obs_dim, spec.act_dim),
            weights_layout(spec, tensors, int8),
            CONTROL_LAYOUT,
        ]
        # before any block or the child exists: the blocks, plus a page each for the lock's semaphore and slack
        check_shm_space(sum(block_bytes(x) for x in layouts) + 4 * block_bytes([]), "--finetune's learner process")
        try:
            self.ring_block, self.weights, self.control = (self._block(x) for x in layouts)
            self.weights.write(tensors)
            self.knobs, self.flags = self.control["knobs"], self.control["flags"]
            self.knobs[SCALE] = 1.0  # until the coordinator writes the governor's knobs
            publish = ctx.Lock()
            self.ring = StagingRing(
                self.ring_block.arrays, np.array(spec.action_low), np.array(spec.action_high), publish
            )
            self.conn, child_conn = ctx.Pipe()
            config = {
                "spec": spec.to_dict(),
                "parent_pid": os.getpid(),
                "blocks": {
                    "ring": self.ring_block.describe(),
                    "weights": self.weights.describe(),
                    "control": self.control.describe(),
                },
                "tensor_names": self.tensor_names,
                "int8": bool(int8),
                **settings,
            }
            self.process = ctx.Process(
                target=serve, args=(json.dumps(config), child_conn, publish), name="sac-edge-learner", daemon=True
            )
            with _callers_main_hidden():
                self.process.start()
            child_conn.close()
            self.ready = self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _block(self, layout: Any) -> SharedArrays:
        block = SharedArrays(layout)
        self._blocks.append(block)
        return block

    def _wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for message in self.messages(timeout=0.1):
                if message.get("kind") == "error":
                    raise SacEdgeError(f"the learner process failed to start: {message.get('error')}")
                if message.get("kind") == "ready":
                    return message
            failure = self.failure()
            if failure is not None:
                raise SacEdgeError(f"{failure} before it was ready; see its output above")
        raise SacEdgeError(f"the learner process was not ready after {START_TIMEOUT_S:g} s; is the CPU overloaded?")

    # -- what the coordinator thread uses ------------------------------------------------------------
    def messages(self, timeout: float = 0.0) -> list[dict[str, Any]]:
        """The child's messages that have arrived (waiting up to ``timeout`` for the first)."""
        out: list[dict[str, Any]] = []
        try:
            while self.conn.poll(timeout if not out else 0):
                out.append(json.loads(self.conn.recv_bytes().decode()))
        except (EOFError, OSError):  # the child is gone; failure() says how
            pass
        return out

    def resolve(self, verdict: str) -> None:
        """The candidate the child proposed last is settled (``promote`` or ``rollback``)."""
        _send(self.conn, {"cmd": "resolve", "verdict": verdict})

    def set_knobs(self, scale: float, batch: int, paused: bool, window_ok: bool) -> None:
        self.knobs[SCALE], self.knobs[BATCH], self.knobs[PAUSED] = scale, batch, float(paused)
        self.flags[WINDOW_OK] = int(window_ok)

    @property
    def collected(self) -> int:
        return int(self.flags[COLLECTED])

    @property
    def updates(self) -> int:
        return int(self.flags[UPDATES])

    def candidate(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
        """Copies of the learner state, the re-quantised initializers and the checked states the child
        wrote with its last proposal."""
        return read_candidate(self.weights, self.tensor_names, self.int8_names)

    def failure(self) -> str | None:
        """Why the child is gone (None while it runs or after a clean stop)."""
        code = self.process.exitcode if self.process is not None else None
        if code is None or code == 0:
            return None
        how = f"signal {-code}" if code < 0 else f"code {code}"
        return f"the learner process exited with {how}"

    def close(self) -> None:
        """Stop the child (the stop flag, then SIGKILL after ``STOP_TIMEOUT_S``) and unlink every block."""
        if self.process is not None and self.process.pid is not None:
            with contextlib.suppress(Exception):
                self.flags[STOP] = 1
            self.process.join(STOP_TIMEOUT_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        while self._blocks:
            self._blocks.pop().unlink()


@contextlib.contextmanager
def _callers_main_hidden() -> Iterator[None]:
    """Start the ``spawn`` child with an empty ``__main__``, so it does not re-run the caller's script.

    ``spawn`` tells its child to re-import the parent's ``__main__`` (by path or module name) before it
    unpickles the target, so that functions defined there can be found. The learner's target lives in this
    module and its arguments are JSON, a pipe and a lock, so nothing needs the caller's main; re-running it
    would run a robot script written without ``if __name__ == "__main__":`` a second time in the learner
    (connecting to and homing the robot again). While the child's start-up data is written, ``__main__`` is
    a fresh empty module, which names neither a file nor a module to import. (``forkserver`` would not help:
    its children re-import the main module the same way.)"""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


# -- the child ------------------------------------------------------------------------------------------
def serve(config_json: str, conn: Any, publish: Any) -> None:
    """The learner process's entry point: attach, build the learner, report ``ready``, learn until stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cfg = json.loads(config_json)
    _die_with_parent(int(cfg["parent_pid"]))
    try:
        settings = FinetuneSettings.from_json(cfg["finetune"])
        _keep_off(list(settings.cpus))
        ring_block, weights, control = (SharedArrays.attach(cfg["blocks"][k]) for k in ("ring", "weights", "control"))
        spec = PolicySpec.from_dict(cfg["spec"], source="the learner process's config")
        ring = StagingRing(ring_block.arrays, np.array(spec.action_low), np.array(spec.action_high), publish)
        loop = LearnerLoop.build(spec, Channels(ring, weights, control, conn), cfg, settings)
        from sac_edge.train import compat

        _send(conn, {"kind": "ready", "torch_notes": compat.notes(), **loop.sizing})
        loop.run(int(cfg["parent_pid"]))
    except Exception as err:  # reported on the pipe as one line; the main process restores the last good weights
        with contextlib.suppress(OSError):
            _send(conn, {"kind": "error", "error": one_line(err)})
        sys.exit(1)


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        sys.exit(0)


def _keep_off(loop_cpus: list[int]) -> None:
    """Run on the CPUs the control loop is not pinned to (``--cpus``), when there are any left: the loop's
    core then has no learner to preempt when its slot comes (measured: BENCHMARKS.md,
    "Edge: fine-tuning beside the 1 kHz loop")."""
    rest = os.sched_getaffinity(0) - set(loop_cpus)
    if loop_cpus and rest:
        os.sched_setaffinity(0, rest)


@dataclass(frozen=True)
class Channels:
    """The learner process's hand-offs with the main process."""

    ring: StagingRing
    """The transitions the control thread stages, drained into the replay buffer."""
    weights: SharedArrays
    """Where a candidate's tensors, its int8 sets and its shadow states are published."""
    control: SharedArrays
    """The governor's knobs (in) and the counters and flags (both ways)."""
    conn: Any
    """The pipe: events and candidates out, verdicts in."""


class LearnerLoop:
    """The child's work: drain the ring, earn update credit, update, propose candidates, obey ``resolve``."""

    def __init__(
        self,
        spec: PolicySpec,
        learner: Any,
        channels: Channels,
        settings: FinetuneSettings,
        sizing: Mapping[str, Any],
        requantizer: Int8Requantizer | None = None,
    ) -> None:
        self.spec, self.learner, self.requantizer = spec, learner, requantizer
        self.ring, self.weights, self.conn = channels.ring, channels.weights, channels.conn
        self.knobs, self.flags = channels.control["knobs"], channels.control["flags"]
        self.sizing = dict(sizing)
        """The learner's sizing as chosen at start-up, with the UTD and why (reported in ``ready``)."""
        self.utd = float(sizing["utd"])
        self.swap_every = settings.section.swap_every
        self.learning_starts = settings.section.learning_starts
        self.shadow_max_diff = settings.section.shadow_max_diff
        self.good_state = _numpy(learner.state())
        self.pending: dict[str, np.ndarray] | None = None
        self.awaiting = False  # a proposal the main process has not resolved yet
        self.credit = 0.0
        self.since = 0
        self._metrics: Any = None

    @classmethod
    def build(
        cls, spec: PolicySpec, channels: Channels, cfg: Mapping[str, Any], settings: FinetuneSettings
    ) -> LearnerLoop:
        """Size the learner for the memory budget (this process's resident memory after torch's and the int8
        re-check's warm-ups plus the main process's baseline), time an update, choose the UTD, load the
        starting tensors."""
        import torch

        from .learner import DeviceLearner, net_shape, warm_up_math
        from .sizing import choose_sizing, choose_utd

        torch.set_num_threads(1)
        warm_up_math(spec)
        tensors = {k: torch.from_numpy(channels.weights[k].copy()) for k in cfg["tensor_names"]}
        requantizer = None
        if cfg["int8"]:  # one re-check whose verdict is not used: its sessions' memory counts from here on
            requantizer = Int8Requantizer(reopen_bundle(cfg["bundle"], cfg["manifest"], spec))
            actor = {k: v.numpy() for k, v in tensors.items() if k.startswith("actor.")}
            requantizer.requantize(actor, np.zeros((SHADOW_STATES, spec.obs_dim), np.float32))
        baseline = float(cfg["main_baseline_mb"]) + read_process_memory().rss_mb
        sizing = choose_sizing(
            net_shape(spec, tensors),
            rows=settings.section.finetune_buffer,
            batch=settings.section.finetune_batch,
            staging=STAGING_ROWS,
            min_rows=max(settings.section.learning_starts, MIN_FINETUNE_ROWS),
            budget_mb=settings.mem_budget_mb,
            baseline_mb=baseline,
        )
        learner = DeviceLearner(spec, tensors, sizing, settings.section.finetune_lr, settings.seed)
        extra = sorted(set(tensors) - set(learner.state()))
        if extra:  # the shared block holds the file's tensors; each candidate must fill all of them
            raise SacEdgeError(f"learner tensors hold {extra[0]} (and {len(extra) - 1} more) that the networks lack")
        utd, reason = choose_utd(
            settings.section.finetune_utd, learner.update_seconds, settings.rate_hz, settings.section.learner_cpu
        )
        facts = {
            **sizing.to_dict(),
            "utd": utd,
            "update_ms": round(learner.update_seconds * 1e3, 3),
            "reasons": [*sizing.reasons, reason],
        }
        return cls(spec, learner, channels, settings, facts, requantizer)

    def run(self, parent_pid: int) -> None:
        while not self.flags[STOP] and os.getppid() == parent_pid:
            while self.conn.poll(0):
                self.handle(json.loads(self.conn.recv_bytes().decode()))
            self.ingest()
            if not self.learn_once():
                time.sleep(IDLE_S)
        if self.flags[STOP]:  # a clean stop: the rows pushed since the last drain count as collected too
            self.ingest()

    def handle(self, message: Mapping[str, Any]) -> None:
        """``resolve``: the main process settled the last proposal; ``promote`` makes it the last good."""
        if message.get("cmd") != "resolve":
            raise SacEdgeError(f"the learner process got an unknown command {message.get('cmd')!r}")
        verdict = message.get("verdict")
        if verdict == "promote" and self.pending is not None:
            self.good_state = self.pending
        elif verdict == "rollback":
            self.learner.load_actor(self.good_actor())
            self.since = 0  # the next candidate gets a full swap_every updates from the last good weights
        self.pending, self.awaiting = None, False

    def good_actor(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.good_state.items() if k.startswith("actor.")}

    def ingest(self) -> None:
        chunk = self.ring.drain()
        if chunk is None:
            return
        n = len(chunk.rewards)
        self.learner.add(chunk)
        self.flags[COLLECTED] += n
        self.credit = min(self.credit + n * self.utd * float(self.knobs[SCALE]), float(self.swap_every))

    def learn_once(self) -> bool:
        batch = int(self.knobs[BATCH]) or self.learner.sizing.batch_size
        if self.knobs[PAUSED] or self.learner.rows < self.learning_starts or self.credit < 1.0:
            return False
        self._metrics = self.learner.update(batch)
        self.flags[UPDATES] += 1
        self.since += 1
        self.credit -= 1.0
        if self.since >= self.swap_every and not self.awaiting and self.flags[WINDOW_OK]:
            self.since = 0
            self.propose()
        return True

    def propose(self) -> None:
        """Check the learner's actor (finite losses, shadow check); publish it as a candidate or say why not."""
        facts = {"updates": int(self.flags[UPDATES]), "collected": int(self.flags[COLLECTED])}
        if not bool(self._metrics.finite):
            self._reset_to_good(facts)
            return
        weights = self.learner.actor_weights()
        states = self.learner.recent_states(SHADOW_STATES)
        shadow = shadow_check(
            self.learner.actions(weights, states),
            self.learner.actions(self.good_actor(), states),
            self.spec.action_low,
            self.spec.action_high,
            self.shadow_max_diff,
        )
        if not shadow.ok:
            self.learner.load_actor(self.good_actor())
            _send(
                self.conn,
                {
                    "kind": "event",
                    "counter": "shadow_rejections",
                    "reason": f"shadow check: {shadow.reason}",
                    "shadow": shadow._asdict(),
                    **facts,
                },
            )
            return
        sets = weight_sets(self.requantizer, weights, states)
        if not sets.passed:  # never served: the learner learns on from its actor, as after a skip
            _send(
                self.conn,
                {
                    "kind": "event",
                    "event": "skip",
                    "counter": "int8_skipped",
                    "reason": "int8 re-quantisation failed the gate's action-error check; candidate skipped, "
                    "serving the last good weights",
                    "int8": sets.int8_facts,
                    **facts,
                },
            )
            return
        self._publish(sets.int8, states)
        _send(self.conn, {"kind": "candidate", "shadow": shadow._asdict(), "int8": sets.int8_facts, **facts})

    def _reset_to_good(self, facts: Mapping[str, int]) -> None:
        """After non-finite losses: the whole learner back to the last good state, and the main process told."""
        import torch

        self.learner.load({k: torch.from_numpy(v.copy()) for k, v in self.good_state.items()})
        reason = "non-finite losses; learner reset to the last good weights"
        _send(self.conn, {"kind": "event", "counter": "nonfinite", "reason": reason, **facts})

    def _publish(self, int8: Mapping[str, np.ndarray], states: np.ndarray) -> None:
        """The learner's state, its int8 sets and the shadow states into shared memory; the candidate then
        awaits the main process's verdict."""
        self.pending = _numpy(self.learner.state())
        self.weights.write(self.pending)
        self.weights.write({INT8 + k: v for k, v in int8.items()})
        self.weights[STATES][: len(states)] = states
        self.weights[N_STATES][...] = len(states)
        self.awaiting = True


def _numpy(tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in tensors.items()}
