"""The grid parser and the command's checks: every mistake is one line, exit 2, before Ray starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.sweep.cli import main, parse_args
from sac_edge.sweep.grid import parse_grid, plan


def test_keys_cross_in_order_with_typed_values() -> None:
    points = parse_grid(["actor-lr=1e-4,3e-4", "hidden=64,64/128", "autotune=false,true"])
    assert len(points) == 8
    assert points[0].label == "actor_lr=1e-4 hidden=64,64 autotune=false"
    assert points[0].values == {"actor_lr": 1e-4, "hidden": (64, 64), "autotune": False}
    assert points[-1].values == {"actor_lr": 3e-4, "hidden": (128,), "autotune": True}


def test_no_grid_is_one_default_point_and_seeds_start_at_seed(tmp_path: Path) -> None:
    trials = plan(parse_grid([]), 3, 2, tmp_path)
    assert [(t.point.label, t.seed) for t in trials] == [("default", 3), ("default", 4)]
    assert trials[0].run == tmp_path.resolve() / "trials" / "default-seed3"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("actor_rl=1e-4", "not a sac-train option; did you mean actor_lr?"),
        ("actor_lr=fast", "--grid actor_lr: expected float, got 'fast'"),
        ("batch_size=64,1.5", "--grid batch_size: expected int, got '1.5'"),
        ("amp=off,int4", "--grid amp: expected one of auto, off, bf16, fp16, got 'int4'"),
        ("hidden=64,x", "--grid hidden: expected a comma-separated list, got '64,x'"),
        ("seed=1,2", "--grid seed: the sweep sets it; use --seeds"),
        ("profile=0,50", "--grid profile: the sweep sets it; use sac-train --profile on one run"),
        ("actor_lr", "expected KEY=V1,V2,..."),
        ("gamma=0.9,,0.99", "empty or repeated value"),
    ],
)
def test_grid_errors_name_the_fix(spec: str, message: str) -> None:
    with pytest.raises(SacEdgeError) as err:
        parse_grid([spec])
    assert message in str(err.value)


def test_a_key_twice_is_refused() -> None:
    with pytest.raises(SacEdgeError, match="given twice"):
        parse_grid(["gamma=0.9", "gamma=0.99"])


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("sac-sweep: error: ")
    return err[0]


def test_bad_grid_is_exit_2_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    assert main(["--out", str(out), "--grid", "actor_lr=1e-4,oops"]) == 2
    assert "expected float, got 'oops'" in _one_error_line(capsys)
    assert not out.exists()


def test_sweep_checks_before_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "a"), "--eval-every", "0"]) == 2
    assert "--eval-every" in _one_error_line(capsys)
    assert main(["--out", str(tmp_path / "b"), "--resume"]) == 2
    assert "nothing to resume" in _one_error_line(capsys)
    assert main(["--out", str(tmp_path), "--seeds", "0"]) == 2
    assert "--seeds must be at least 1" in _one_error_line(capsys)
    assert main(["--out", str(tmp_path / "c"), "--price-per-hour", "-1"]) == 2  # bca952e: every trial failed
    assert "--price-per-hour must be a price of 0 or more" in _one_error_line(capsys)
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("profile", [["--profile"], ["--profile", "5"]])
def test_profile_is_refused_before_ray(tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: list[str]) -> None:
    """Every trial would stop once profiled: on bca952e the sweep started Ray and ranked runs cut short."""
    out = tmp_path / "sweep"
    assert main(["--out", str(out), *profile]) == 2
    assert "--profile stops a run once profiled, so no sweep takes it" in _one_error_line(capsys)
    assert not out.exists()


def test_negative_numbers_are_values_of_the_sweep_s_and_sac_train_s_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """``--target-return -1e9`` was "expected one argument" on bca952e (only ``=-1e9`` worked)."""
    sweep, _ = parse_args(["--target-return", "-1e9", "--out", "s"])
    assert sweep.target_return == -1e9
    assert main(["--target-return", "-inf", "--out", "s"]) == 2
    assert "--target-return must be a finite number, got -inf" in _one_error_line(capsys)
    assert main(["--init-alpha", "-5e-2", "--out", "s"]) == 2  # a value of sac-train's, refused as a value
    assert "--init-alpha must be a positive number, got -0.05" in _one_error_line(capsys)
    assert not Path("s").exists()


def test_without_the_extra_the_message_says_how_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray.tune", None)
    assert main(["--out", str(tmp_path / "s")]) == 2
    assert "pip install 'sac-edge[sweep]'" in _one_error_line(capsys)


def test_only_sac_sweep_imports_ray() -> None:
    code = "import sys, sac_edge.train.trainer, sac_edge.export.cli, sac_edge.edge_runtime.cli, sac_edge.sweep.cli\n"
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'scipy')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
