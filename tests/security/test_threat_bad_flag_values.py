"""Finding 8: every bad flag value is exit 2 with one line, checked before slow work starts.

(A read-only ``--out`` is covered by permission checks, which root bypasses; the test skips as root.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.train import cli as train_cli


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rate-hz", "inf"], "--rate-hz must be a finite number"),
        (["--rate-hz", "1e12"], "--rate-hz must be from 0.001 to 100000"),
        (["--rate-hz", "nan"], "--rate-hz must be a finite number"),
        (["--duration", "inf"], "--duration must be a finite number"),
        (["--duration", "nan"], "--duration must be a finite number"),
        (["--power-budget-w", "-1"], "--power-budget-w must be a positive number"),
        (["--power-budget-w", "nan"], "--power-budget-w must be a finite number"),
        (["--mem-budget-mb", "0"], "--mem-budget-mb must be a positive number"),
        (["--restart"], "--restart only applies with --finetune"),
        (["--idle-latency-us", "-1"], "--idle-latency-us -1 is negative"),
    ],
)
def test_bad_run_flag_is_one_line_before_any_work(
    bundle: Path, refused: Callable[..., str], flags: list[str], message: str
) -> None:
    t0 = time.monotonic()
    assert message in refused(edge_cli.main, ["run", str(bundle), *flags])
    assert time.monotonic() - t0 < 5  # no backend timing, no loop


def test_telemetry_into_a_directory_is_refused_up_front(
    bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    assert "is a directory" in refused(edge_cli.main, ["run", str(bundle), "--telemetry", str(tmp_path)])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batch", "100000000"], "--batch needs sizes from 1 to 65536"),
        (["--batch", "0"], "--batch needs sizes"),
        (["--out", "{tmp}"], "--out {tmp} is a directory"),
        (["--plot", "{tmp}"], "--plot {tmp} is a directory"),
        (["--out", "{tmp}/file/x.json"], "is not a writable directory"),
    ],
)
def test_bad_bench_flag_is_one_line_before_the_benchmark(
    bundle: Path, tmp_path: Path, refused: Callable[..., str], flags: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("a file, not a directory")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    assert message.replace("{tmp}", str(tmp_path)) in refused(edge_cli.main, ["bench", str(bundle), *flags])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hidden", "0,0"], "--hidden needs one or more layer widths"),
        (["--hidden=-4,8"], "--hidden needs one or more layer widths"),
        (["--hidden", ""], "got (empty)"),
        (["--hidden", "99999999"], "from 1 to 65536"),
        (["--out", "{file}"], "is a file; pass a directory path"),
    ],
)
def test_bad_train_flag_is_one_line(
    tmp_path: Path, refused: Callable[..., str], flags: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("x")
    flags = [f.replace("{file}", str(tmp_path / "file")) for f in flags]
    argv = ["--total-steps", "10", "--out", str(tmp_path / "run"), *flags]
    assert message in refused(train_cli.main, argv, prog="sac-train")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_read_only_train_out_is_one_line(tmp_path: Path, refused: Callable[..., str]) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    argv = ["--total-steps", "10", "--out", str(locked / "run")]
    assert "is not a writable directory" in refused(train_cli.main, argv, prog="sac-train")
