"""Every bad flag value is exit 2 with one line, checked before slow work starts: argparse's own
errors too (one line naming the flag and the fix, not its usage block), NaN and infinity for any number,
values no control loop or trainer can use, grid values before Ray starts, and names quoted from files
(escaped, so they cannot forge a line or drive the terminal).

(A read-only ``--out`` is covered by permission checks, which root bypasses; the test skips as root.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime import compose
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
        (["--rate-hz", "1e-300"], "--rate-hz must be from 0.001 to 100000 steps per second"),
        (["--duration", "1e308"], "--duration must be from 0 (run until stopped) to 1e+09 seconds"),
        (["--spin-us", "nan"], "--spin-us must be a finite number"),
        (["--spin-us", "1e12"], "--spin-us must be from 0 to 1e+06"),
        (["--idle-latency-us", "99999999999999999999"], "is more than PM QoS takes; use 0 to 2147483647"),
        (["--rate-hz", "abc"], "argument --rate-hz: invalid float value: 'abc'; pass a number"),
        (["--seed", "-1"], "--seed must be from 0"),
        (["--realtime-priority", "-5"], "--realtime-priority must be 1..99 (0: off)"),
        (["--realtime-priority", "100"], "--realtime-priority must be 1..99 (0: off)"),
        (["--cpus=-1"], "--cpus takes CPU numbers from 0"),
        (["--inference-timeout", "0"], "--inference-timeout must be more than 0"),
        (["--max-backend-errors", "0"], "--max-backend-errors must be at least 1"),
        (["--auto-calls", "1000000000000"], "--auto-calls must be from 1 to 100000"),
        (["--auto-calls", "100000001"], "--auto-calls must be from 1 to 100000"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag; remove them"),
        (["--backend"], "argument --backend: expected one argument; give the flag its value"),
        (["--shift", "g=nan"], "--shift entry 'g=nan' must be a finite number"),
        (["--shift", "m=-inf"], "--shift entry 'm=-inf' must be a finite number"),
    ],
)
def test_bad_run_flag_is_one_line_before_any_work(
    bundle: Path, refused: Callable[..., str], flags: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_backends(*args: object, **kwargs: object) -> None:
        raise AssertionError("a backend was opened before the flags were checked")

    monkeypatch.setattr(compose, "open_backends", no_backends)
    assert message in refused(edge_cli.main, ["run", str(bundle), *flags])


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
        (["--actor-lr", "nan"], "--actor-lr must be a finite number, got nan"),
        (["--critic-lr", "-1"], "--critic-lr must be a positive number, got -1.0"),
        (["--gamma", "2"], "--gamma must be in (0, 1], got 2.0"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--seed", "-1"], "--seed must be 0 or more"),
        (["--total-steps", "ten"], "argument --total-steps: invalid int value: 'ten'; pass an integer"),
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


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into directories without write permission")
def test_read_only_train_out_is_one_line(tmp_path: Path, refused: Callable[..., str]) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    argv = ["--total-steps", "10", "--out", str(locked / "run")]
    assert "is not a writable directory" in refused(train_cli.main, argv, prog="sac-train")


def _read_only_mount_works(path: Path) -> bool:
    """Whether this process may make a read-only bind mount of ``path`` in a mount namespace of its own."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = f"mount --bind {path} {path} && mount -o remount,bind,ro {path} && ! touch {path}/probe"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


def _refused_on_read_only(locked: Path, argv: list[str]) -> str:
    """``argv`` run with ``locked`` bind-mounted read-only; its one stderr line (exit 2 asserted)."""
    import shlex
    import subprocess

    if not _read_only_mount_works(locked):
        pytest.skip("needs root and unshare to make a read-only bind mount in a private mount namespace")
    script = f"mount --bind {locked} {locked} && mount -o remount,bind,ro {locked} && exec {shlex.join(argv)}"
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_train_out_on_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    """What root meets on a read-only mount (EROFS, which permissions do not explain): one line, exit 2."""
    import sys

    locked = tmp_path / "ro"
    locked.mkdir()
    train = Path(sys.executable).parent / "sac-train"
    line = _refused_on_read_only(locked, [str(train), "--total-steps", "10", "--out", str(locked / "run")])
    assert "is not a writable directory" in line


def test_finetune_on_a_read_only_bundle_is_one_line(tmp_path: Path, bundle: Path) -> None:
    """A bundle on a read-only mount still serves; --finetune, which must write its last good weights
    there, is refused in one line before anything loads."""
    import shutil
    import sys

    locked = tmp_path / "ro"
    shutil.copytree(bundle, locked)
    edge = Path(sys.executable).parent / "sac-edge"
    line = _refused_on_read_only(locked, [str(edge), "run", str(locked), "--finetune", "--duration", "1"])
    assert f"--finetune-dir {locked / 'finetune'}" in line and "not a writable directory" in line


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("actor_lr=3e-4,nan", "--grid actor_lr: expected a finite number, got 'nan'"),
        ("actor_lr=inf", "--grid actor_lr: expected a finite number, got 'inf'"),
        ("actor_lr=-1", "--grid actor_lr: must be a positive number, got -1.0"),
        ("batch_size=0,64", "--grid batch_size: must be at least 1, got 0"),
        ("tau=1.5", "--grid tau: must be in (0, 1], got 1.5"),
    ],
)
def test_bad_sweep_grid_values_are_one_line_before_ray_starts(
    tmp_path: Path, refused: Callable[..., str], grid: str, message: str
) -> None:
    import sys

    from sac_edge.sweep import cli as sweep_cli

    ray_loaded = "ray" in sys.modules
    argv = [
        "--grid",
        grid,
        "--seeds",
        "1",
        "--total-steps",
        "10",
        "--eval-every",
        "10",
        "--out",
        str(tmp_path / "sweep"),
    ]
    assert message in refused(sweep_cli.main, argv, prog="sac-sweep")
    assert ("ray" in sys.modules) == ray_loaded and not (tmp_path / "s").exists()


def test_a_json_integer_too_long_to_convert_is_one_line(bundle: Path, refused: Callable[..., str]) -> None:
    text = (bundle / "manifest.json").read_text()
    (bundle / "manifest.json").write_text(
        text.replace('"format_version": ', '"format_version": ' + "9" * 5000 + ', "x": ')
    )
    err = refused(edge_cli.main, ["run", str(bundle)])
    assert "holds a number too long to be one sac-edge wrote" in err and len(err) < 600


def test_names_from_a_file_cannot_forge_lines_or_drive_the_terminal(bundle: Path, refused: Callable[..., str]) -> None:
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    forged = "x\nsac-edge: all checks passed\x1b[2J\x1b]0;owned\x07.onnx"
    manifest["files"][forged] = manifest["files"]["policy.onnx"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    err = refused(edge_cli.main, ["run", str(bundle)])  # one line (asserted by ``refused``)
    assert "\x1b" not in err and "\x07" not in err and "\\nsac-edge: all checks passed\\x1b[2J" in err


def test_export_out_through_a_dangling_symlink_is_refused_before_the_export(
    tmp_path: Path, refused: Callable[..., str]
) -> None:
    from sac_edge.export import cli as export_cli

    (tmp_path / "out").symlink_to(tmp_path / "gone")
    err = refused(export_cli.main, [str(tmp_path / "no-run"), "--out", str(tmp_path / "out")], prog="sac-export")
    assert "--out" in err and "is a symlink to a missing path" in err


def test_a_calibration_file_whose_header_claims_terabytes_is_one_error(tmp_path: Path) -> None:
    import struct

    from sac_edge.calibration.states import load_calib_states
    from sac_edge.common.errors import SacEdgeError

    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 3), }"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    (tmp_path / "calib_states.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    with pytest.raises(SacEdgeError, match=r"not a readable \.npy array"):  # was: MemoryError (10.9 TiB), exit 1
        load_calib_states(tmp_path, 3)
