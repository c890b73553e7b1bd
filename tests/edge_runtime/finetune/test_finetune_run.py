"""``sac-edge run --finetune`` end to end, and ``--resume`` after the process was killed mid-fine-tune."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sac_edge.common.manifest import sha256_file
from sac_edge.edge_runtime.cli import main
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore

FAST = [
    "--backend", "onnxruntime", "--rate-hz", "1000", "--learning-starts", "200", "--swap-every", "20",
    "--finetune-buffer", "2000", "--finetune-batch", "32",
]  # fmt: skip


def _json(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_finetune_smoke(finetune_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    telemetry = tmp_path / "t.jsonl"
    argv = ["run", str(finetune_bundle), "--finetune", "--duration", "3", "--shift", "m=1.5", *FAST]
    argv += ["--finetune-dir", str(tmp_path / "ft"), "--promotion-window", "1", "--telemetry", str(telemetry), "--json"]
    assert main(argv) == 0
    summary = _json(capsys)
    ft = summary["finetune"]
    # Past --learning-starts (the 3000 slots at 1 kHz shrink on a busy machine: no count beyond it is promised)
    assert ft["updates"] > 0 and ft["steps_collected"] > 200 and ft["error"] is None
    assert ft["sizing"]["batch_size"] == 32 and ft["sizing"]["buffer_rows"] == 2000
    assert summary["shift"]["m"]["new"] == 1.5 and "miss_rate" in summary
    kinds = [json.loads(line).get("event") for line in telemetry.read_text().splitlines()]
    assert "sizing" in kinds and "swap" in kinds


def test_resume_after_sigkill_keeps_the_last_good_weights(
    finetune_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(finetune_bundle, bundle)
    store = LastGoodStore(bundle / "finetune")
    cmd = [sys.executable, "-m", "sac_edge.edge_runtime.cli", "run", str(bundle), "--finetune", "--duration", "120"]
    cmd += [*FAST, "--promotion-window", "1", "--rollback-threshold", "1000"]  # promote every candidate
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = json.loads(store.info_path.read_text()) if store.info_path.is_file() else {}
            if info.get("generation", 0) >= 2:  # at least two promotions written while it kept learning
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("no promotion within 60 s")
        learners = _children(proc.pid)
        assert learners, "no learner process"
        os.kill(proc.pid, signal.SIGKILL)  # mid-fine-tune: the learner process is still updating and promoting
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in learners):  # no orphan: the learner dies with its parent
            assert time.monotonic() < deadline, f"learner process {learners} outlived its parent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    last = store.load()
    info = json.loads(store.info_path.read_text())
    assert last.sha256 == sha256_file(store.path)
    # the pair is consistent, or (killed between the two renames) the tensors file is the newer one
    assert info["sha256"] == last.sha256 or last.info["generation"] > info["generation"]

    assert main(["run", str(bundle), "--resume", "--duration", "0.3", "--backend", "onnxruntime", "--json"]) == 0
    resumed = _json(capsys)["resume"]
    assert resumed["sha256"] == last.sha256 and resumed["live"] and resumed["seconds"]["fp32"] > 0
    argv = ["run", str(bundle), "--resume", "--finetune", "--duration", "0.5", *FAST, "--json"]
    assert main(argv) == 0
    summary = _json(capsys)
    assert summary["resume"]["sha256"] == last.sha256 and summary["finetune"]["error"] is None
