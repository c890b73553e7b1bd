"""``sac-train --profile``: the breakdown by op category on both gradient paths, its trace, its coverage,
and the run it leaves (train/profiling.py)."""

import json

import pytest
import torch

from sac_edge.train.cli import main
from sac_edge.train.profiling import BREAKDOWN, COLUMNS, PROFILE_DIR, TRACE, category

PENDULUM = ["--env", "Pendulum-v1", "--learning-starts", "100", "--eval-every", "0", "--no-progress"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("aten::addmm", "matmul"),
        ("aten::baddbmm", "matmul"),
        ("aten::threshold_backward", "activations"),
        ("aten::clamp_min_", "activations"),
        ("aten::tanh", "activations"),
        ("aten::cat", "cat/copy/index"),
        ("aten::_to_copy", "cat/copy/index"),
        ("aten::index", "cat/copy/index"),
        ("Memcpy HtoD (Pageable -> Device)", "host-device copies"),
        ("aten::_fused_adam_", "optimiser"),
        ("aten::_foreach_lerp_", "optimiser"),
        ("Optimizer.step#Adam.step", "optimiser"),
        ("aten::mul", "elementwise & reductions"),
        ("aten::sum", "elementwise & reductions"),
        ("autograd::engine::evaluate_function: AddmmBackward0", "other"),
        ("aten::empty_strided", "other"),
    ],
)
def test_category(name, expected):
    assert category(name) == expected


@pytest.mark.slow
@pytest.mark.parametrize("backward", ["manual", "autograd"])
def test_profile_prints_the_breakdown_and_stops_resumably(tmp_path, capsys, backward):
    run = tmp_path / "run"
    argv = [*PENDULUM, "--total-steps", "2000", "--out", str(run), "--backward", backward, "--profile", "20"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    for cat in (*COLUMNS, "untraced", "categories cover", "collection"):
        assert cat in captured.err, cat
    result = json.loads((run / PROFILE_DIR / BREAKDOWN).read_text())
    assert result["updates"] == 20 and set(result["host_ms"]) == set(COLUMNS)
    assert result["coverage"] >= 0.9, result  # the bar: categories explain the update's time
    assert 0 < result["op_coverage"] <= result["coverage"] and set(result["op_ms"]) == set(COLUMNS)
    assert result["host_ms"]["matmul"] > 0 and result["host_ms"]["optimiser"] > 0
    assert 0 < result["collect_share"] < 1
    trace = json.loads((run / PROFILE_DIR / TRACE).read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"sac:collect", "sac:sample", "sac:critic", "sac:actor", "sac:alpha", "sac:target"} <= names
    # warm-up (50 updates) and the profiled 20, then a checkpoint: the run continues with --resume
    assert summary["updates"] == 70 and summary["steps"] < 2000
    assert main(["--out", str(run), "--resume", "--total-steps", str(summary["steps"] + 10), "--no-progress"]) == 0


def test_profile_too_long_for_the_run_is_one_line(tmp_path, capsys):
    assert main([*PENDULUM, "--total-steps", "200", "--out", str(tmp_path / "run"), "--profile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--profile 200" in err[0] and "--total-steps" in err[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_profile_on_cuda_has_device_times(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*PENDULUM, "--total-steps", "2000", "--out", str(run), "--device", "cuda", "--profile", "20"]) == 0
    result = json.loads((run / PROFILE_DIR / BREAKDOWN).read_text())
    assert result["coverage"] >= 0.9 and sum(result["device_ms"].values()) > 0
