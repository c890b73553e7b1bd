"""``--threads 0`` (auto): the intra-op thread count of the update, measured on this machine now, and
watched during the run.

Too many threads is the costly mistake: every intra-op parallel region waits at its barrier for a thread
the scheduler has handed to a neighbour, so beside one busy process torch's default (all cores) ran 3x
slower than one thread and beside two ROS 2 executors 68x slower (issue 43); too few costs at most the
parallel speed-up (1.3x on 2 quiet cores). So:

1. ``usable_cpus``: the CPUs this process may run on (``sched_getaffinity``), capped by the cgroup's CPU
   quota (a container limited to 2 CPUs on a 64-core host), never the host's core count.
2. ``probe_threads``: a short timing at start (no new round after ``PROBE_BUDGET_S``; a count at under half
   the best is dropped after a round; 3.9-4.6 s measured beside heavy load): the run's own update on a throwaway
   learner, at 1, 2, 4, ... up to the usable CPUs, interleaved rounds, median per count; the fewest
   threads within ``TOLERANCE`` of the fastest wins (fewer threads hold up better when neighbours come).
3. ``ThreadWatch``: during the run, windows of update time; when updates/s falls below ``COLLAPSE`` of the
   best window at the current count, one window at half the threads, kept if faster; after a step down,
   a window at the higher count every ``RETRY_S`` seconds of update time, kept if faster (the neighbour
   left). Each kept change is one log line and one entry of ``changes`` in ``config.json``'s
   ``choices.threads`` (with ``current``, the count now; a resumed run keeps the record before as ``earlier``).

``--threads N`` forces N and turns all of this off. Measured in BENCHMARKS.md, "Training: threads beside
busy neighbours" (``bench/train_threads.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from sac_edge.common.spec import PolicySpec

from .config import TrainConfig

#: A count within this factor of the fastest measured counts as as fast (prefer fewer threads).
TOLERANCE = 1.10
#: Seconds of updates per measurement in the start-up probe, and interleaved rounds per count.
PROBE_SLICE_S = 0.025
PROBE_ROUNDS = 5
#: A count slower than the best by this factor after a round is not timed again.
DROP = 2.0
#: No new round starts after this many seconds of probing.
PROBE_BUDGET_S = 1.5
#: A window's updates/s below this fraction of the best window at the current count is a collapse.
COLLAPSE = 0.5
#: Seconds of update time per watch window, and between tries of a higher count after a step down.
WINDOW_S = 1.0
RETRY_S = 30.0


class UsableCpus(NamedTuple):
    """How many CPUs this process may use, and what set that number."""

    n: int
    source: str


def cgroup_cpu_limit(root: Path = Path("/")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (cgroup v2 ``cpu.max``, v1 ``cfs_quota_us``), or None
    when unlimited or unreadable."""
    v2 = root / "sys/fs/cgroup/cpu.max"
    v1 = (root / "sys/fs/cgroup/cpu/cpu.cfs_quota_us", root / "sys/fs/cgroup/cpu/cpu.cfs_period_us")
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if v1[0].is_file():
            quota_us, period_us = (int(p.read_text().strip()) for p in v1)
            return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None
    return None


def usable_cpus(root: Path = Path("/")) -> UsableCpus:
    """The CPUs this process may run on (its affinity mask), capped by its cgroup's CPU quota."""
    try:
        count, source = len(os.sched_getaffinity(0)), "sched_getaffinity"
    except (AttributeError, OSError):  # not Linux
        count, source = os.cpu_count() or 1, "cpu_count"
    limit = cgroup_cpu_limit(root)
    if limit is not None and math.ceil(limit) < count:
        count, source = max(1, math.ceil(limit)), f"cgroup CPU quota {limit:g}"
    return UsableCpus(count, source)


def candidate_counts(cpus: int) -> list[int]:
    """1, 2, 4, ... below ``cpus``, and ``cpus`` itself."""
    counts = [1 << i for i in range(max(cpus, 1).bit_length()) if 1 << i < cpus]
    return [*counts, max(cpus, 1)]


class ThreadChoice(NamedTuple):
    """The chosen count, why (one log line), and what was measured (``config.json``'s record)."""

    threads: int
    reason: str
    record: dict[str, Any]


def forced_threads(threads: int, cpus: UsableCpus) -> ThreadChoice:
    """``--threads N``: N, with a warning in the reason when N exceeds the usable CPUs."""
    reason = f"--threads {threads} (forced)"
    if threads > cpus.n:
        reason += f"; warning: only {cpus.n} CPUs are usable here ({cpus.source}), expect waits at barriers"
    return ThreadChoice(threads, reason, {"threads": threads, "mode": "forced", "usable_cpus": cpus.n})


def _rate(step: Callable[[], Any], sync: Callable[[], None], slice_s: float) -> float:
    """Updates/s of ``step`` over at least ``slice_s`` seconds. The first call at a new thread count wakes
    the pool, so it is timed apart and counts only when it alone took the whole slice (a slow count needs
    no more calls to show it is slow)."""
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    if first >= slice_s:
        return 1.0 / first
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= slice_s:
            return n / elapsed


def fewest_about_as_fast(rates: dict[int, float]) -> int:
    """The fewest threads whose updates/s is within ``TOLERANCE`` of the fastest count's."""
    best = max(rates.values())
    return min(n for n, rate in rates.items() if rate * TOLERANCE >= best)


def probe_threads(
    step: Callable[[], Any],
    cpus: UsableCpus,
    sync: Callable[[], None] = lambda: None,
    rounds: int = PROBE_ROUNDS,
    slice_s: float = PROBE_SLICE_S,
) -> ThreadChoice:
    """Time ``step`` (one update of the run's shape) at each candidate count in interleaved rounds and choose
    the fewest threads within ``TOLERANCE`` of the fastest median. Leaves torch at the chosen count."""
    counts = candidate_counts(cpus.n)
    if len(counts) == 1:
        torch.set_num_threads(1)
        reason = f"--threads auto -> 1: 1 usable CPU ({cpus.source})"
        return ThreadChoice(1, reason, {"threads": 1, "mode": "auto", "usable_cpus": 1, "cpus_from": cpus.source})
    samples: dict[int, list[float]] = {n: [] for n in counts}
    t0, active = time.perf_counter(), list(counts)
    torch.set_num_threads(1)
    step()  # first-call work (optimiser state, allocations) stays out of every count's timing
    sync()
    for _ in range(rounds):
        for n in active:
            torch.set_num_threads(n)
            samples[n].append(_rate(step, sync, slice_s))
        # A count at under half the best so far cannot end within TOLERANCE of it: stop timing it (beside
        # busy neighbours a wide count can take a second an update).
        so_far = {n: statistics.median(samples[n]) for n in active}
        active = [n for n in active if so_far[n] * DROP >= max(so_far.values())]
        if len(active) == 1 or time.perf_counter() - t0 > PROBE_BUDGET_S:
            break
    median = {n: statistics.median(s) for n, s in samples.items()}
    threads = fewest_about_as_fast(median)
    torch.set_num_threads(threads)
    shown = ", ".join(f"{n}: {median[n]:.0f}" for n in counts)
    reason = (
        f"--threads auto -> {threads}: {cpus.n} usable CPUs ({cpus.source}); updates/s measured now {shown}; "
        f"the fewest threads within {TOLERANCE:.2f}x of the fastest"
    )
    record = {
        "threads": threads,
        "mode": "auto",
        "usable_cpus": cpus.n,
        "cpus_from": cpus.source,
        "probe_updates_per_s": {str(n): round(r, 1) for n, r in median.items()},
        "probe_s": round(time.perf_counter() - t0, 2),
    }
    return ThreadChoice(threads, reason, record)


class ThreadWatch:
    """Watches updates/s during the run and moves the thread count when it collapses (auto mode only).

    ``observe`` takes each stretch of updates with its time; it sets torch's thread count itself and
    returns a log line when a change is kept (None otherwise).
    """

    def __init__(self, threads: int, ceiling: int, window_s: float | None = None, retry_s: float | None = None) -> None:
        self.threads, self.ceiling = threads, ceiling
        # The module's constants read now, not when it loaded: a test shortens them for one run.
        self.window_s = WINDOW_S if window_s is None else window_s
        self.retry_s = RETRY_S if retry_s is None else retry_s
        self.best: dict[int, float] = {}  # best window updates/s seen at each count
        self._updates, self._seconds = 0, 0.0
        self._since_change = 0.0  # update seconds since the last kept change
        self._trial: tuple[int, float] | None = None  # (count to return to, its rate) while trying another
        self.changes: list[dict[str, Any]] = []

    def observe(self, updates: int, seconds: float) -> str | None:
        self._updates += updates
        self._seconds += seconds
        if self._seconds < self.window_s:
            return None
        rate = self._updates / self._seconds
        self._since_change += self._seconds
        self._updates, self._seconds = 0, 0.0
        if self._trial is not None:
            return self._end_trial(rate)
        best = self.best.get(self.threads, 0.0)
        self.best[self.threads] = max(best, rate)
        if self.threads > 1 and rate < COLLAPSE * best:
            self._start_trial(self.threads // 2, rate)
        elif self.threads < self.ceiling and self._since_change >= self.retry_s:
            self._start_trial(min(self.threads * 2, self.ceiling), rate)
        return None

    def _start_trial(self, threads: int, rate: float) -> None:
        self._trial = (self.threads, rate)
        self._set(threads)

    def _end_trial(self, rate: float) -> str | None:
        assert self._trial is not None
        back, before = self._trial
        self._trial = None
        self._since_change = 0.0
        if rate <= before * TOLERANCE:  # no faster: return; a lasting slow-down is the new normal there
            tried = self.threads
            self._set(back)
            self.best[back] = before if tried < back else max(self.best.get(back, 0.0), before)
            return None
        self.changes.append({"from": back, "to": self.threads, "before": round(before, 1), "after": round(rate, 1)})
        self.best[self.threads] = rate
        if self.threads < back:
            return (
                f"--threads auto: updates/s fell to {before:.0f} with {back} threads (busy neighbours on these "
                f"CPUs?); {self.threads} threads run {rate:.0f}/s, kept"
            )
        return f"--threads auto: {self.threads} threads run {rate:.0f} updates/s again (from {before:.0f}), kept"

    def _set(self, threads: int) -> None:
        self.threads = threads
        torch.set_num_threads(threads)


def watched_record(record: dict[str, Any], threads: int) -> dict[str, Any]:
    """``config.json``'s thread record of a watched run at its start: the count now (``current``) and the
    watch's kept changes (``changes``, none yet)."""
    return {**record, "current": threads, "changes": []}


def with_change(record: dict[str, Any], change: dict[str, Any], threads: int) -> dict[str, Any]:
    """``record`` with one kept change of the watch added and ``current`` the count that change moved to."""
    return {**record, "current": threads, "changes": [*record.get("changes", []), change]}


#: Replay rows the throwaway learner of the probe holds (random data: only the update's time matters).
PROBE_ROWS = 1024


def update_step(spec: PolicySpec, cfg: TrainConfig, device: torch.device) -> Callable[[], Any]:
    """One eager update of the run's shape (networks, batch, precision, backward) on a throwaway learner with
    random replay contents: what the probe times. Seeds torch's global generator (as any learner does)."""
    from .sac import SAC  # the learner imports this module's neighbours; keep the import one-way at load

    probe = SAC(
        spec,
        dataclasses.replace(cfg, compile="off", cuda_graphs=False, buffer_size=max(cfg.batch_size, PROBE_ROWS)),
        device,
    )
    rng = np.random.default_rng(cfg.seed)
    rows = probe.buffer.capacity
    obs = rng.standard_normal((rows, spec.obs_dim)).astype(np.float32)
    act = rng.uniform(-1, 1, (rows, spec.act_dim)).astype(np.float32)
    probe.buffer.add(obs, act, rng.standard_normal(rows), obs, np.zeros(rows, np.float32))
    return probe.train_step


def choose_threads(
    cfg: TrainConfig, spec: PolicySpec, device: torch.device, cpus: UsableCpus | None = None
) -> ThreadChoice:
    """``--threads N`` forced, or for 0 the probe's choice on this run's update; torch is left at the count."""
    cpus = cpus or usable_cpus()
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
        return forced_threads(cfg.threads, cpus)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    return probe_threads(update_step(spec, cfg, device), cpus, sync)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch at ``threads`` intra-op threads inside the block, restored after."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
