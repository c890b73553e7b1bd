"""sac-edge error conventions: one line on stderr, exit 2, nothing run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.cli import main


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("sac-edge: error:"), err
    return err


def test_missing_bundle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "manifest.json is missing" in _error(capsys, ["run", str(tmp_path / "nope")])


def test_checksum_mismatch(pendulum_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "b"
    shutil.copytree(pendulum_bundle, root)
    with open(root / "policy.onnx", "ab") as fh:
        fh.write(b"\0")
    assert "checksum mismatch for policy.onnx" in _error(capsys, ["run", str(root)])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env", "NoSuchEnv-v0"], "unknown environment"),
        (["--env", "MountainCarContinuous-v0"], "do not match the bundle's spec"),
        (["--backend", "onnxruntime", "--precision", "fp16"], "fp16 is not in the bundle"),
        (["--resume"], "no last good weights"),
        (["--rate-hz", "0"], "--rate-hz must be from"),
        (["--backend", "tensorrt"], "tensorrt"),
    ],
)
def test_run_input_errors(
    pendulum_bundle: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert message in _error(capsys, ["run", str(pendulum_bundle), "--duration", "0.1", *extra])


def test_int8_rejected_by_the_gate(rejected_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, ["run", str(rejected_bundle), "--backend", "onnxruntime", "--precision", "int8"])
    assert "int8 was rejected by the bundle's accuracy gate" in err


def test_unknown_backend_is_refused_by_the_parser(pendulum_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "invalid choice" in _error(capsys, ["run", str(pendulum_bundle), "--backend", "tflite"])


def test_bench_errors(pendulum_bundle: Path, rejected_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "unknown backend" in _error(capsys, ["bench", str(pendulum_bundle), "--backends", "tflite"])
    assert "rejected" in _error(
        capsys, ["bench", str(rejected_bundle), "--backends", "onnxruntime", "--precisions", "int8"]
    )
    assert "unknown command" in _error(capsys, ["serve", str(pendulum_bundle)])


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--rate-hz" in out and "--obs-fault" in out and "--mem-budget-mb" in out
    groups = ["backend", "loop", "shield", "realtime", "budget", "finetune"]  # the sections, in order
    starts = [out.index(f"\n{name}:\n") for name in groups]
    assert starts == sorted(starts)
    flags = {"backend": "--backend {", "loop": "--rate-hz", "shield": "--shield {", "finetune": "--finetune,"}
    for name, flag in flags.items():  # each flag under its section's heading
        i = groups.index(name)
        assert flag in out[starts[i] : starts[i + 1] if i + 1 < len(starts) else None], name
