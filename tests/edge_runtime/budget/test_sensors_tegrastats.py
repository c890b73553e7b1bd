"""tegrastats line forms (L4T 32 plain, L4T 34+ mW, dated JetPack 6 lines) and the two tegrastats readers."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.sensors import (
    SensorError,
    TegrastatsLogSensor,
    TegrastatsSensor,
    parse_tegrastats_line,
    read_tegrastats_log,
)
from sac_edge.edge_runtime.budget.sensors.tegrastats import RailPower

LOGS = Path(__file__).resolve().parents[2] / "fixtures" / "tegrastats"


def lines(name: str) -> list[str]:
    return (LOGS / name).read_text().splitlines()


def test_xavier_nx_root_line_every_field() -> None:
    s = parse_tegrastats_line(lines("xavier_nx_root_datadog.log")[0])
    assert (s.ram_used_mb, s.ram_total_mb) == (4412, 7772)
    assert (s.swap_used_mb, s.swap_total_mb, s.swap_cached_mb) == (139, 3886, 2)
    assert [c.load_pct for c in s.cpus] == [9, 6, 6, 5, 4, 8]
    assert [c.freq_mhz for c in s.cpus] == [1190] * 5 + [1267]
    assert (s.gr3d_pct, s.gr3d_freq_mhz, s.emc_pct, s.emc_freq_mhz) == (62, (306,), 10, 1600)
    assert s.temps_c["AO"] == 41.5 and s.temps_c["PMIC"] == 100 and s.temps_c["thermal"] == 42.55
    assert {k: (r.cur_mw, r.avg_mw) for k, r in s.rails.items()} == {
        "VDD_IN": (4067, 4067),
        "VDD_CPU_GPU_CV": (738, 738),
        "VDD_SOC": (1353, 1353),
    }
    reading = s.power_reading(3.0)
    assert reading.total_w == pytest.approx(4.067) and reading.measured and reading.timestamp == 3.0


def test_xavier_nx_nonroot_full_load_line() -> None:
    s = parse_tegrastats_line(lines("xavier_nx_jp46_nonroot.log")[0])
    assert [(c.load_pct, c.freq_mhz) for c in s.cpus] == [(100, 1420)] * 6
    assert (s.emc_pct, s.emc_freq_mhz, s.gr3d_pct, s.gr3d_freq_mhz) == (0, None, 99, ())
    assert (s.rails["VDD_IN"].cur_mw, s.rails["VDD_IN"].avg_mw) == (14703, 14683)
    assert s.cpu_load_pct == 100


def test_mw_form_and_orin_fields() -> None:
    agx_orin, orin, r36 = (parse_tegrastats_line(line) for line in lines("orin_mw_datadog.log"))
    assert agx_orin.rails["VDD_IN"].cur_mw == 5299 and agx_orin.power_reading(0).total_w == pytest.approx(5.299)
    assert sum(not c.online for c in agx_orin.cpus) == 4 and agx_orin.temps_c["CV0"] == 45.812
    assert set(orin.rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"} and orin.gr3d_freq_mhz == ()
    assert r36.gr3d_freq_mhz == (305, 305) and r36.ram_total_mb == 30697 and len(r36.cpus) == 12
    assert r36.power_reading(0).total_w == pytest.approx(3.205 + 4.405 + 4.767)  # no VDD_IN: the sum


def test_l4t32_boards_memory_fields_are_not_rails() -> None:
    tx1, tx2, nano, agx = (parse_tegrastats_line(line) for line in lines("l4t32_boards_datadog.log"))
    for sample in (tx1, tx2, nano, agx):
        assert not {"RAM", "SWAP", "IRAM"} & set(sample.rails)
    assert tx1.power_reading(0).total_w == pytest.approx(2.532)
    assert nano.power_reading(0).total_w == pytest.approx(1.022)  # POM_5V_IN is the total
    assert [c.online for c in tx2.cpus] == [True, False, False, True, True, True]
    assert agx.power_reading(0).total_w == pytest.approx((0 + 311 + 932 + 0 + 621 + 1482) / 1000)


def test_old_tx1_cpu_form_with_one_shared_frequency() -> None:
    # hordiales/jetson-tx1-dev SCRIPTS.md, L4T 28
    s = parse_tegrastats_line(
        "RAM 3468/3983MB (lfb 48x4MB) SWAP 873/8192MB (cached 295MB) "
        "cpu [17%,13%,29%,5%]@408 EMC 1%@408 APE 25 GR3D 3%@76"
    )
    assert [(c.load_pct, c.freq_mhz) for c in s.cpus] == [(17, 408), (13, 408), (29, 408), (5, 408)]
    assert (s.emc_pct, s.emc_freq_mhz, s.gr3d_pct, s.gr3d_freq_mhz) == (1, 408, 3, (76,))
    with pytest.raises(SensorError, match="no power rails"):
        s.power_reading(0)


def test_dated_log_skips_foreign_lines() -> None:
    samples = read_tegrastats_log(LOGS / "orin_nano_jp6_timestamped.log")
    assert [s.stamp for s in samples] == ["04-27-2026 15:00:54", "04-27-2026 15:00:55", "04-27-2026 15:00:56"]
    assert samples[0].rails["VDD_IN"].avg_mw == 6625


def test_garbage_is_not_a_line() -> None:
    with pytest.raises(ValueError, match="not a tegrastats line"):
        parse_tegrastats_line("Segmentation fault (core dumped)")


def fake_tegrastats(tmp_path: Path, log: str, exit_code: int | None = None) -> Path:
    """A stand-in for /usr/bin/tegrastats: takes --interval MS and prints a real log's lines at that pace."""
    script = tmp_path / "tegrastats"
    body = (
        f"sys.stderr.write('tegrastats: cannot open power rails\\n'); sys.exit({exit_code})"
        if exit_code
        else (
            f"lines = open({str(LOGS / log)!r}).read().splitlines()\n"
            "for i in range(10**6):\n"
            "    print(lines[i % len(lines)], flush=True)\n"
            "    time.sleep(int(sys.argv[2]) / 1000)"
        )
    )
    script.write_text(f"#!{sys.executable}\nimport sys, time\nassert sys.argv[1] == '--interval'\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_tegrastats_sensor_runs_the_binary_and_follows_its_lines(tmp_path: Path) -> None:
    binary = fake_tegrastats(tmp_path, "l4t32_boards_datadog.log")
    with TegrastatsSensor(binary, interval_ms=20) as sensor:
        totals: set[float] = set()
        deadline = time.monotonic() + 10
        while len(totals) < 3 and time.monotonic() < deadline:
            totals.add(round(sensor.read().total_w, 3))
            time.sleep(0.01)
        assert len(totals) >= 3 and totals <= {2.532, 3.056, 1.022, 3.346}  # the four boards' totals, in turn
        latest = sensor.latest_sample()
        assert latest is not None and latest.ram_total_mb in {3983, 7852, 3964, 31927}
    assert sensor._proc.poll() is not None  # closed: the subprocess is gone


def test_tegrastats_sensor_reports_a_failing_or_missing_binary(tmp_path: Path) -> None:
    with pytest.raises(SensorError, match="cannot run"):
        TegrastatsSensor(tmp_path / "nope")
    sensor = TegrastatsSensor(fake_tegrastats(tmp_path, "", exit_code=3), first_line_timeout_s=5)
    with sensor, pytest.raises(SensorError, match="cannot open power rails"):
        sensor.read()


def test_log_sensor_reads_the_last_line_as_the_log_grows(tmp_path: Path) -> None:
    log = tmp_path / "tegrastats.log"
    log.write_text(lines("xavier_nx_root_datadog.log")[0] + "\n")
    sensor = TegrastatsLogSensor(log)
    assert sensor.read().total_w == pytest.approx(4.067)
    with open(log, "a") as fh:
        fh.write(lines("xavier_nx_jp46_nonroot.log")[0] + "\n")
    assert sensor.read().total_w == pytest.approx(14.703)
    with pytest.raises(SensorError, match="no tegrastats log"):
        TegrastatsLogSensor(tmp_path / "missing.log")


def test_negative_rails_and_the_three_figure_form_are_kept() -> None:
    """A rail below zero (a sense offset on an idle rail) is a reading, not noise to drop; newer releases print
    three values per rail, whose first two are the instantaneous and the average power."""
    line = (
        "12-04-2026 10:00:00 RAM 3100/62841MB (lfb 5x4MB) SWAP 0/31421MB (cached 0MB) CPU [1%@1344,off] "
        "GR3D_FREQ 0% cpu@45.1C VDD_GPU 9761mW/9761mW/9761mW VDD_CPU_SOC_MSS 3120mW/3000mW/3410mW "
        "VIN_SYS_5V0 -12mW/-8mW/0mW VIN 14650mW/14600mW/15010mW"
    )
    sample = parse_tegrastats_line(line)
    assert sample.rails["VDD_GPU"] == RailPower(9761, 9761)
    assert sample.rails["VIN_SYS_5V0"] == RailPower(-12, -8)
    assert set(sample.rails) == {"VDD_GPU", "VDD_CPU_SOC_MSS", "VIN_SYS_5V0", "VIN"}
    assert sample.power_reading(0.0).total_w == 14.65  # VIN is the board input where it exists
    old = parse_tegrastats_line("RAM 1/2MB VDD_IN 4067/4067 VDD_SOC -5/-3")
    assert old.rails == {"VDD_IN": RailPower(4067, 4067), "VDD_SOC": RailPower(-5, -3)}
