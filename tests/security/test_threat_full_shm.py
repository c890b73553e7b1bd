"""``/dev/shm`` is full (Fast DDS keeps its transport there; Docker gives 64 MiB): fine-tuning must not kill
the controller. The learner's shared blocks are reserved when created, so a ``/dev/shm`` too small for them is
one line and exit 2 before the learner starts, and one that fills during the run cannot raise SIGBUS in the
loop: the run ends with its summary.

The small ``/dev/shm`` is real: a size-limited tmpfs mounted over it in a private mount namespace
(``unshare -m``, which needs root); the run and the filler are entered into that namespace with ``nsenter``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

FAST = [
    "--backend", "onnxruntime", "--rate-hz", "1000", "--learning-starts", "200", "--swap-every", "20",
    "--finetune-buffer", "2000", "--finetune-batch", "32", "--promotion-window", "1",
]  # fmt: skip


def _namespace(size: str) -> Iterator[int]:
    """A process holding a private mount namespace whose /dev/shm is a tmpfs of ``size``; yields its pid."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs root and util-linux's unshare/nsenter to mount a small /dev/shm")
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && echo ready && exec sleep 600"
    holder = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        if holder.stdout.readline().strip() != "ready":
            holder.wait(10)
            why = holder.stderr.read() if holder.stderr else ""
            pytest.skip(f"cannot mount a tmpfs in a private namespace here: {why}")
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


@pytest.fixture
def small_shm() -> Iterator[int]:
    yield from _namespace("16k")  # less than the learner tensors written at start (Pendulum, 32x32)


@pytest.fixture
def shm_8m() -> Iterator[int]:
    yield from _namespace("8m")


def _inside(pid: int, argv: list[str]) -> list[str]:
    return ["nsenter", "-t", str(pid), "-m", *argv]


def _run_argv(bundle: Path, tmp_path: Path, duration: str) -> list[str]:
    argv = [sys.executable, "-m", "sac_edge.edge_runtime.cli", "run", str(bundle), "--finetune"]
    return [*argv, "--duration", duration, *FAST, "--finetune-dir", str(tmp_path / "ft"), "--json"]


def test_a_small_dev_shm_is_one_line_before_the_learner_starts(
    clean_finetune_bundle: Path, tmp_path: Path, small_shm: int
) -> None:
    done = subprocess.run(
        _inside(small_shm, _run_argv(clean_finetune_bundle, tmp_path, "2")), capture_output=True, text=True, timeout=300
    )
    err = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, err)  # was -7: SIGBUS at the first store, no line
    assert len(err.splitlines()) == 1, err  # refused before the learner process sized itself (its log line)
    assert err.startswith("sac-edge: error: /dev/shm has 0.02 MiB free") and "--shm-size" in err, err
    listed = subprocess.run(_inside(small_shm, ["ls", "-A", "/dev/shm"]), capture_output=True, text=True, check=True)
    assert listed.stdout.split() == []  # no block left behind


@contextlib.contextmanager
def _learning(argv: list[str]) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A fine-tuning run started from ``argv``, once its learner is ready (the sizing line, returned with the
    lines before it); killed by group if the test leaves it running."""
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert run.stderr is not None
        seen = []
        for line in run.stderr:  # the learner is ready and the loop about to start: untouched ring pages remain
            seen.append(line)
            if "fine-tune sizing" in line:
                break
        else:
            pytest.fail("".join(seen))
        yield run, "".join(seen)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


def test_dev_shm_filled_during_a_run_leaves_the_loop_running_to_its_summary(
    clean_finetune_bundle: Path, tmp_path: Path, shm_8m: int
) -> None:
    with _learning(_inside(shm_8m, _run_argv(clean_finetune_bundle, tmp_path, "4"))) as (run, seen):
        fill = subprocess.run(
            _inside(shm_8m, ["dd", "if=/dev/zero", "of=/dev/shm/filler", "bs=64k"]), capture_output=True, text=True
        )
        assert "No space left on device" in fill.stderr, fill.stderr  # /dev/shm is full now
        out, rest = run.communicate(timeout=120)
    assert run.returncode == 0, (run.returncode, seen + rest)  # was -7 (SIGBUS): no summary
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "duration" and summary["steps"] > 1000
    assert summary["finetune"]["steps_collected"] > 1000 and summary["finetune"]["error"] is None


def test_a_learner_killed_by_sigbus_stops_fine_tuning_and_the_run_ends_with_its_summary(
    clean_finetune_bundle: Path, tmp_path: Path
) -> None:
    with _learning(_run_argv(clean_finetune_bundle, tmp_path, "3")) as (run, seen):
        time.sleep(0.5)
        os.kill(int(seen.rsplit("learner process", 1)[1].strip()), signal.SIGBUS)
        out, _ = run.communicate(timeout=120)
    assert run.returncode == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "duration"
    assert f"signal {int(signal.SIGBUS)}" in summary["finetune"]["error"]
