"""``--threads`` past the CPUs this process may use: onnxruntime creates every thread it is asked for, so
``--threads 100000`` crashed under a memory limit or took minutes to start (2000: 40 s). The count is bounded by
the affinity mask (``os.sched_getaffinity``: a container's or ``taskset``'s CPUs, not the machine's), refused
in one line before any session is created."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime import bench, compose
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.config import RuntimeOptions
from sac_edge.edge_runtime.runtime import Runtime

USABLE_SET = os.sched_getaffinity(0)
USABLE = len(USABLE_SET)


def _no_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a backend was opened before --threads was checked")

    monkeypatch.setattr(compose, "open_backends", refuse)
    monkeypatch.setattr(bench, "open_backend", refuse)


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("threads", [USABLE + 1, 100000])
def test_threads_past_the_usable_cpus_are_one_line_before_any_session(
    bundle: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, command: str, threads: int
) -> None:
    _no_sessions(monkeypatch)
    line = refused(edge_cli.main, [command, str(bundle), "--threads", str(threads)])
    assert f"--threads must be from 1 to {USABLE} (the CPUs this process may use), got {threads}" in line


def test_the_library_refuses_them_at_construction(bundle: Path) -> None:
    with pytest.raises(SacEdgeError, match="--threads must be from 1 to"):
        Runtime(RuntimeOptions.of(str(bundle), threads=USABLE + 1))


def test_the_bound_is_the_affinity_mask_not_the_machine(bundle: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "sac_edge.edge_runtime.cli",
        "run",
        str(bundle),
        "--threads",
        "2",
        "--duration",
        "0.1",
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, preexec_fn=lambda: os.sched_setaffinity(0, {min(USABLE_SET)})
    )
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip() == "sac-edge: error: --threads must be from 1 to 1 (the CPUs this process may use), got 2"
    )
