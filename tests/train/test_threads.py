"""``--threads 0`` (auto): the usable CPUs, the start-up probe's choice, the watch that steps down when
updates/s collapses (and back up when it recovers), single-threaded helpers, and the record in
``config.json`` and the log."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from sac_edge.common.config import parse_config
from sac_edge.train import threads
from sac_edge.train import trainer as trainer_module
from sac_edge.train.cli import main
from sac_edge.train.config import TrainConfig
from sac_edge.train.threads import ThreadWatch, UsableCpus
from sac_edge.train.trainer import Trainer


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_cgroup_quota_caps_the_affinity(tmp_path: Path):
    cgroup = tmp_path / "sys/fs/cgroup"
    cgroup.mkdir(parents=True)
    assert threads.cgroup_cpu_limit(tmp_path) is None  # no files: no limit
    (cgroup / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    (cgroup / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) == 1.5
    affinity = len(os.sched_getaffinity(0))
    got = threads.usable_cpus(tmp_path)
    assert got.n == min(affinity, 2)
    assert got.source == ("cgroup CPU quota 1.5" if affinity > 2 else "sched_getaffinity")
    (cgroup / "cpu.max").unlink()
    v1 = cgroup / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_cpu_limit(tmp_path) is None
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    assert threads.usable_cpus(tmp_path) == UsableCpus(1, "cgroup CPU quota 0.5")


def test_candidates_double_up_to_the_usable_cpus():
    assert threads.candidate_counts(1) == [1]
    assert threads.candidate_counts(2) == [1, 2]
    assert threads.candidate_counts(6) == [1, 2, 4, 6]
    assert threads.candidate_counts(64) == [1, 2, 4, 8, 16, 32, 64]


def _paced_step(seconds_at: dict[int, float]):
    """A step that takes ``seconds_at[torch's thread count]``: a stand-in workload whose speed per thread
    count the test sets (the probe's logic is what is under test, not torch's scaling)."""
    return lambda: time.sleep(seconds_at[torch.get_num_threads()])


def test_the_fewest_threads_about_as_fast_as_the_fastest_win():
    assert threads.fewest_about_as_fast({1: 100.0, 2: 180.0, 4: 190.0}) == 2  # 4 within 10%: fewer wins
    assert threads.fewest_about_as_fast({1: 100.0, 2: 180.0, 4: 200.0}) == 4
    assert threads.fewest_about_as_fast({1: 150.0, 2: 50.0, 4: 10.0}) == 1


def test_the_probe_times_each_count_and_keeps_the_fastest():
    cpus = UsableCpus(4, "test")
    # Sleeps only overrun on a busy machine: the 3x gaps keep their order through that.
    quiet = threads.probe_threads(_paced_step({1: 0.03, 2: 0.01, 4: 0.03}), cpus, rounds=3, slice_s=0.05)
    assert quiet.threads == 2 and torch.get_num_threads() == 2
    assert quiet.record["mode"] == "auto" and set(quiet.record["probe_updates_per_s"]) == {"1", "2", "4"}
    assert quiet.reason.startswith("--threads auto -> 2: 4 usable CPUs (test)")
    busy = threads.probe_threads(_paced_step({1: 0.01, 2: 0.03, 4: 0.1}), cpus, rounds=3, slice_s=0.05)
    assert busy.threads == 1
    assert set(busy.record["probe_updates_per_s"]) == {"1", "2", "4"}  # each timed at least once


def test_one_usable_cpu_needs_no_probe():
    choice = threads.probe_threads(lambda: pytest.fail("no timing on one CPU"), UsableCpus(1, "test"))
    assert choice.threads == 1 and "1 usable CPU" in choice.reason


def test_forced_threads_warn_beyond_the_usable_cpus():
    assert "warning" not in threads.forced_threads(2, UsableCpus(2, "test")).reason
    assert "only 2 CPUs are usable" in threads.forced_threads(8, UsableCpus(2, "test")).reason


def _feed(watch: ThreadWatch, rate: float, windows: int = 1) -> list[str | None]:
    """``windows`` watch windows at ``rate`` updates/s (one ``observe`` call each)."""
    return [watch.observe(int(rate * watch.window_s), watch.window_s) for _ in range(windows)]


def test_the_watch_steps_down_when_updates_collapse_and_logs_it_once():
    watch = ThreadWatch(4, ceiling=4, window_s=1.0, retry_s=1e9)
    assert _feed(watch, 200, 3) == [None] * 3 and watch.threads == 4
    assert _feed(watch, 150) == [None] and watch.threads == 4  # slower, not collapsed
    assert _feed(watch, 40) == [None] and watch.threads == 2 and torch.get_num_threads() == 2  # one trial window
    (line,) = _feed(watch, 120)
    assert line is not None and "fell to 40 with 4 threads" in line and "2 threads run 120/s, kept" in line
    assert watch.changes == [{"from": 4, "to": 2, "before": 40.0, "after": 120.0}]
    assert _feed(watch, 120, 5) == [None] * 5 and watch.threads == 2  # logged once, then steady


def test_the_watch_returns_when_fewer_threads_are_no_faster():
    watch = ThreadWatch(2, ceiling=2, window_s=1.0, retry_s=1e9)
    _feed(watch, 200)
    _feed(watch, 60)  # collapse (the whole machine slowed): try 1 thread
    assert watch.threads == 1
    assert _feed(watch, 55) == [None] and watch.threads == 2 and watch.changes == []
    assert _feed(watch, 60, 3) == [None] * 3 and watch.threads == 2  # the slow rate is the new normal there


def test_the_watch_goes_back_up_when_the_neighbour_leaves():
    watch = ThreadWatch(2, ceiling=2, window_s=1.0, retry_s=3.0)
    _feed(watch, 200)
    _feed(watch, 50)
    _feed(watch, 150)  # kept at 1 thread
    assert watch.threads == 1
    _feed(watch, 150, 2)
    assert watch.threads == 1  # not yet RETRY_S of updates since the change
    _feed(watch, 150)
    assert watch.threads == 2  # a trial window at the higher count
    (line,) = _feed(watch, 210)
    assert line is not None and "2 threads run 210 updates/s again" in line and watch.threads == 2


def test_the_watch_reads_its_window_and_retry_when_built(monkeypatch: pytest.MonkeyPatch):
    """Bound as defaults when the module loaded, a test could not shorten them for one run."""
    monkeypatch.setattr(threads, "WINDOW_S", 0.01)
    monkeypatch.setattr(threads, "RETRY_S", 0.05)
    watch = ThreadWatch(2, ceiling=2)
    assert (watch.window_s, watch.retry_s) == (0.01, 0.05)
    assert ThreadWatch(2, ceiling=2, window_s=1.0).window_s == 1.0


def test_torch_threads_restores_the_count():
    torch.set_num_threads(2)
    with threads.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


ARGS = ["--env", "Pendulum-v1", "--learning-starts", "100", "--total-steps", "150", "--hidden", "16,16",
        "--batch-size", "16", "--no-progress", "--eval-every", "0"]  # fmt: skip


def test_auto_threads_are_measured_logged_and_saved(tmp_path: Path, capsys):
    run = tmp_path / "run"
    assert main([*ARGS, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    usable = threads.usable_cpus().n
    assert record["mode"] == "auto" and 1 <= record["threads"] <= usable and record["usable_cpus"] == usable
    assert f"--threads auto -> {record['threads']}: " in out
    if usable > 1:
        assert set(record["probe_updates_per_s"]) == {str(n) for n in threads.candidate_counts(usable)}


def test_forced_threads_are_saved_without_a_probe(tmp_path: Path, capsys):
    run = tmp_path / "run"
    assert main([*ARGS, "--threads", "1", "--out", str(run)]) == 0
    assert "--threads auto" not in capsys.readouterr().out
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    assert record == {"threads": 1, "mode": "forced", "usable_cpus": threads.usable_cpus().n}
    assert torch.get_num_threads() == 1


def test_a_kept_step_down_is_written_to_config_json(tmp_path: Path):
    """The watch of a real run fed windows whose times the test sets (a fake clock: a busy neighbour's effect
    on a shared 2-core machine is no fixture). On bca952e only the start's choice was saved."""
    run = tmp_path / "run"
    trainer = Trainer(parse_config(TrainConfig, [*ARGS, "--out", str(run)], "sac-train", ""))
    trainer.envs.close()
    start = json.loads((run / "config.json").read_text())["choices"]["threads"]
    assert start["current"] == start["threads"] and start["changes"] == []
    assert trainer.thread_watch is not None
    # From 2 threads, whatever the probe chose on this machine (1 here when busy: nothing to step down from).
    trainer.thread_watch = watch = ThreadWatch(2, ceiling=2, window_s=1.0, retry_s=1e9)
    for rate in (200, 40, 120):  # steady, collapsed, then one window at 1 thread: faster, kept
        trainer._watch_threads(rate, 1.0)
    assert watch.threads == 1
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    (change,) = record["changes"]
    assert {k: change[k] for k in ("from", "to", "before", "after", "step")} == {
        "from": 2, "to": 1, "before": 40.0, "after": 120.0, "step": 0
    }  # fmt: skip
    assert change["reason"].startswith("updates/s fell to 40 with 2 threads") and change["wall_s"] >= 0
    assert record["current"] == 1 and record["mode"] == "auto" and record["threads"] == start["threads"]


def test_a_resumed_run_keeps_the_thread_record_before_it(tmp_path: Path, capsys):
    run = tmp_path / "run"
    assert main([*ARGS, "--out", str(run)]) == 0
    first = json.loads((run / "config.json").read_text())["choices"]["threads"]
    assert main(["--resume", "--total-steps", "200", "--out", str(run), "--no-progress", "--threads", "1"]) == 0
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    assert record == {"threads": 1, "mode": "forced", "usable_cpus": threads.usable_cpus().n, "earlier": first}


class _Neighbour(ThreadWatch):
    """The thread watch of a run beside a neighbour that arrives, then leaves, scripted by window: from 2
    threads, the process's CPU affinity narrows to one CPU (and widens back), the count goes down to 1 (a real
    ``torch.set_num_threads`` through the watch's own setter, a count the compiled update has not run at),
    back up to 2 (the neighbour left), down to 1 again, and Ctrl-C comes while it is still there."""

    def __init__(self, threads: int, ceiling: int) -> None:
        super().__init__(2, 2, window_s=0.0)
        self.script: dict[int, str | int] = {2: "narrow", 3: 1, 4: "widen", 6: 2, 8: 1, 10: "sigint"}
        torch.set_num_threads(2)
        self.windows = 0
        self.cpus = os.sched_getaffinity(0)

    def observe(self, updates: int, seconds: float) -> str | None:
        self.windows += 1
        what = self.script.get(self.windows)
        if what == "narrow":
            os.sched_setaffinity(0, {min(self.cpus)})
        elif what == "widen":
            os.sched_setaffinity(0, self.cpus)
        elif what == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        elif isinstance(what, int):
            self._set(what)
        return None


def test_a_thread_change_under_the_compiled_update_never_ends_the_run(tmp_path: Path, capsys, monkeypatch):
    """Issue 51: on 27d6dc3 the first compiled update after the watch changed the thread count ended the run
    (exit 1, "Recompilation triggered with skip_guard_eval_unsafe stance"). Now each new count compiles once
    (timed in config.json), a count seen before reuses its graph, Ctrl-C in the busy spell checkpoints
    (exit 130) and --resume finishes the run."""
    run = tmp_path / "run"
    monkeypatch.setattr(trainer_module, "ThreadWatch", _Neighbour)
    saved_cpus = os.sched_getaffinity(0)
    try:
        code = main([*ARGS, "--total-steps", "400", "--compile", "on", "--out", str(run)])
    finally:
        os.sched_setaffinity(0, saved_cpus)
    out = capsys.readouterr()
    assert code == 130, out.err
    assert "compiled the update again for 1 threads in" in out.out
    assert out.out.count("compiled the update again") == 1  # back at 2, and at 1 again: the graphs kept
    assert "stopped by SIGINT at step" in out.err and "--resume" in out.err
    state = json.loads((run / "trainer_state.json").read_text())
    assert 100 < state["step"] < 400
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    assert set(record["compile_s"]) == {"1", "2"} and all(s > 0 for s in record["compile_s"].values())
    monkeypatch.setattr(trainer_module, "ThreadWatch", ThreadWatch)
    assert main(["--resume", "--total-steps", "400", "--out", str(run), "--no-progress"]) == 0
    assert json.loads((run / "trainer_state.json").read_text())["step"] == 400
