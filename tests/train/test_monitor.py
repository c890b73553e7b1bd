"""``--log-every``: interval rates (a resumed run's own), time per update, memory and CPU in metrics.csv; the
cost numbers of the summary (train/monitor.py, train/cost.py)."""

import csv
import json
import time
from pathlib import Path

import pytest
import torch

from sac_edge.train import cost
from sac_edge.train.cli import main
from sac_edge.train.monitor import GpuSensor, IntervalMonitor, ProcessMemory

TINY = ["--hidden", "32,32", "--batch-size", "32", "--eval-episodes", "1", "--no-progress"]


def _train(out: Path, *extra: str) -> int:
    return main(["--env", "Pendulum-v1", "--learning-starts", "100", "--out", str(out), *TINY, *extra])


def _rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_process_memory_reads_vmrss_and_vmhwm(tmp_path):
    (tmp_path / "status").write_text("Name:\tpython\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n")
    assert ProcessMemory(tmp_path).read() == (100.0, 200.0)
    rss, peak = ProcessMemory().read()  # this process's real /proc
    assert rss is not None and 0 < rss <= peak


def test_process_memory_without_proc_keeps_the_peak(tmp_path):
    rss, peak = ProcessMemory(tmp_path / "absent").read()
    assert rss is None and peak > 0


def test_interval_row_on_a_cpu():
    monitor = IntervalMonitor(torch.device("cpu"), step=100)
    for _ in range(5):
        monitor.timer.start()
        torch.ones(64, 64) @ torch.ones(64, 64)
        monitor.timer.stop()
    time.sleep(0.01)
    row = monitor.row(step=200)
    assert row["steps_per_s"] > 0 and row["updates_per_s"] > 0
    assert 0 < row["update_ms_p50"] <= row["update_ms_p99"]
    assert row["rss_mb"] > 0 and row["peak_rss_mb"] >= row["rss_mb"] and row["cpu_util_pct"] >= 0
    assert all(row[k] == "" for k in ("cuda_max_allocated_mb", "cuda_max_reserved_mb", "gpu_util_pct", "gpu_power_w"))
    empty = monitor.row(step=200)  # a new interval: no updates in it
    assert empty["updates_per_s"] == "" and empty["update_ms_p50"] == "" and empty["steps_per_s"] == 0
    assert monitor.timer.total_updates == 5


def test_gpu_sensor_is_absent_off_cuda():
    assert GpuSensor(torch.device("cpu")).read() == (None, None)


def test_cost_arithmetic():
    assert cost.hours_per_million(1e6 / 3600) == pytest.approx(1.0)
    assert cost.hours_per_million(0.0) is None and cost.eta_s(100, 0.0) is None
    assert cost.eta_s(500, 250.0) == 2.0
    fields = cost.cost_fields(steps_per_s=100.0, run_wall_s=7200.0, price_per_hour=2.5)
    assert fields["cost_usd"] == 5.0 and fields["usd_per_million_steps"] == pytest.approx(2.5e6 / 100 / 3600, 1e-3)
    free = cost.cost_fields(100.0, 7200.0, 0.0)
    assert free["price_per_hour"] is None and free["cost_usd"] is None and free["usd_per_million_steps"] is None
    assert "$" not in cost.cost_line(free, 300.0) and "$5.00 this run" in cost.cost_line(fields, 300.0)


def test_rows_come_every_log_every_steps_with_eta_and_cost(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--total-steps", "400", "--log-every", "100", "--eval-every", "0", "--json",
                  "--price-per-hour", "3") == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = _rows(run)
    assert [int(r["step"]) for r in rows] == [100, 200, 300, 400]
    assert float(rows[-1]["eta_s"]) == 0.0 and float(rows[0]["eta_s"]) > 0
    assert all(r["update_ms_p50"] for r in rows[1:]) and float(rows[-1]["wall_s"]) > 0
    assert summary["steps_per_s"] > 0 and summary["peak_rss_mb"] > 0 and summary["cuda_peak_allocated_mb"] is None
    assert summary["hours_per_million_steps"] == pytest.approx(1e6 / summary["steps_per_s"] / 3600, rel=0.02)
    assert summary["price_per_hour"] == 3 and summary["cost_usd"] == pytest.approx(
        summary["run_wall_s"] / 3600 * 3, abs=1e-3
    )


def test_log_every_zero_logs_at_evaluations_and_the_end(tmp_path):
    run = tmp_path / "run"
    assert _train(run, "--total-steps", "300", "--log-every", "0", "--eval-every", "200") == 0
    assert [(int(r["step"]), bool(r["eval_return"])) for r in _rows(run)] == [(200, True), (300, True)]


def test_a_resumed_run_reports_its_own_interval_rate(tmp_path):
    """Before the fix the first row after --resume divided all 600 steps by the resumed process's time
    (3 times the true rate here)."""
    run = tmp_path / "run"
    assert _train(run, "--total-steps", "400", "--log-every", "200", "--eval-every", "0") == 0
    saved = json.loads((run / "trainer_state.json").read_text())["wall_s"]
    assert saved > 0
    assert main(["--out", str(run), "--resume", "--total-steps", "700", "--no-progress", "--log-every", "300"]) == 0
    rows = {int(r["step"]): r for r in _rows(run)}
    assert sorted(rows) == [200, 400, 600, 700]
    first = rows[600]  # the resumed process's first row: its interval began when the process began training
    session = float(first["wall_s"]) - saved  # this process's seconds up to the row (rounded to 0.1 s)
    assert 0.75 <= float(first["steps_per_s"]) * session / 200 <= 1.25


def test_bad_monitoring_flags_are_one_line(tmp_path, capsys):
    for flag, value in (("--log-every", "-1"), ("--price-per-hour", "-2"), ("--price-per-hour", "nan")):
        assert _train(tmp_path / "run", "--total-steps", "200", flag, value) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and flag in err[0], err
    assert not (tmp_path / "run").exists()
