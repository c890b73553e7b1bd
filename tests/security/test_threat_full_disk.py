"""The telemetry disk fills up (or the file hits its size limit) while the loop runs: control matters more
than its log. A refused record is dropped and counted, the file keeps only whole records, and the run ends
as it would have, with its summary on stdout.

The full disk is real: the run is a child process whose file-size limit (``RLIMIT_FSIZE``) is smaller than
its telemetry, so the kernel refuses the writes past it (``EFBIG``, the way a full disk gives ``ENOSPC``).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

LIMIT = 2048  # bytes: the config record (about 1.2 KB) fits, the per-second records do not all fit


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_a_full_telemetry_disk_drops_and_counts_records_and_the_loop_goes_on(bundle: Path, tmp_path: Path) -> None:
    telemetry = tmp_path / "t.jsonl"
    argv = ["run", str(bundle), "--backend", "onnxruntime", "--rate-hz", "200", "--duration", "3.2", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", *argv, "--telemetry", str(telemetry)],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,  # Python ignores SIGXFSZ, so the write fails instead of killing the child
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["stopped_by"] == "duration" and summary["steps"] > 0
    assert summary["telemetry_dropped"] >= 1
    written = telemetry.read_bytes()
    assert len(written) <= LIMIT and written.endswith(b"\n")
    records = [json.loads(line) for line in written.decode().splitlines()]  # whole records only
    assert records[0]["type"] == "config"
    assert len(records) == summary["telemetry_records"] - 1  # the written ones, all whole (the summary: dropped)


def _no_space_for_files() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # every write past byte 0 fails, as on a full disk


def test_a_full_disk_during_keygen_leaves_no_empty_or_partial_key(tmp_path: Path) -> None:
    name = tmp_path / "fleet"
    done = subprocess.run(
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", "keygen", str(name)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_no_space_for_files,
    )
    assert done.returncode == 2, done.stderr  # was 1, "internal error", and a 0-byte private key left behind
    assert done.stderr.startswith(f"sac-edge: error: cannot write {name} ("), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no key, no public half, no temporary file
    again = subprocess.run(  # so the same name works once there is space
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", "keygen", str(name)], capture_output=True, text=True
    )
    assert again.returncode == 0 and name.stat().st_size > 0 and name.with_name("fleet.pub").stat().st_size > 0
