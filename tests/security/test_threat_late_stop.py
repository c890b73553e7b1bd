"""A stop request (SIGTERM from a service manager, Ctrl-C) is seen within one step's time at any rate: the
loop sleeps to its next slot in short slices, so a slow loop does not sleep through it until the manager
gives up and SIGKILLs it (no summary). Rates too slow to be a control loop are refused up front
(``test_threat_bad_flag_values.py``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path


def test_sigterm_during_a_long_sleep_ends_the_run_at_once_with_its_summary(bundle: Path, tmp_path: Path) -> None:
    telemetry = tmp_path / "t.jsonl"
    # the slowest rate accepted: a step every 1000 s
    argv = ["run", str(bundle), "--backend", "onnxruntime", "--rate-hz", "0.001", "--duration", "0", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", *argv, "--telemetry", str(telemetry)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (telemetry.exists() and telemetry.read_text().endswith("\n")):  # the config record: handlers on
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        time.sleep(0.5)  # into the sleep before the second slot
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)  # was: the rest of the period (up to 1000 s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert time.monotonic() - sent < 60
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] >= 1
    assert json.loads(telemetry.read_text().splitlines()[-1])["type"] == "summary"
