"""The governor driven by a real INA3221 reader over a fixture tree whose values change between ticks."""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.budget.governor import Governor, GovernorConfig, Knobs, build_ladder, event_line
from sac_edge.edge_runtime.budget.sensors import Ina3221HwmonSensor, PowerReading

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
HWMON = Path("sys/bus/i2c/drivers/ina3221/7-0040/hwmon/hwmon6")
VDD_IN_MV = 5024  # in1_input in the fixture

# 1 kHz loop, fine-tuning at batch 256, gate accepted all three precisions
LADDER = build_ladder(
    1000.0, "fp32", ["fp32", "fp16", "int8"], min_rate_hz=250.0, finetune_batch=256, min_finetune_batch=64
)
EXPECTED = [  # (step, knob, new value), in the governor's order
    ("finetune_rate", "update_rate_scale", 0.5),
    ("finetune_rate", "update_rate_scale", 0.25),
    ("finetune_batch", "finetune_batch", 128),
    ("finetune_batch", "finetune_batch", 64),
    ("finetune_pause", "finetune_paused", True),
    ("precision", "precision", "fp16"),
    ("precision", "precision", "int8"),
    ("control_rate", "rate_hz", 500.0),
    ("control_rate", "rate_hz", 250.0),
]


class Board:
    """A Xavier NX JetPack 5 tree in tmp_path whose VDD_IN current the test sets, read by the real sensor."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = Path(shutil.copytree(FIXTURES / "xavier_nx_jp5", tmp_path / "board"))
        self.t = 0.0
        self.sensor = Ina3221HwmonSensor(self.root, clock=lambda: self.t)

    def draw(self, watts: float) -> None:
        (self.root / HWMON / "curr1_input").write_text(f"{round(watts * 1e6 / VDD_IN_MV)}\n")

    def tick(self, governor: Governor, watts: float, memory_mb: float = 100.0) -> list:
        self.draw(watts)
        self.t += 1.0
        return governor.tick(self.t, self.sensor.read(), memory_mb)


def governor(**overrides: float) -> Governor:
    config = GovernorConfig(power_budget_w=6.0, degrade_after=3, recover_after=5, headroom=0.1)
    return Governor(replace(config, **overrides), LADDER)


def test_ladder_follows_the_design_order() -> None:
    assert [(level.step, level.knob, getattr(level.knobs, level.knob)) for level in LADDER[1:]] == EXPECTED
    assert LADDER[0].knobs == Knobs(1.0, 256, False, "fp32", 1000.0)
    assert LADDER[-1].knobs == Knobs(0.25, 64, True, "int8", 250.0)


def test_steps_that_do_not_apply_are_skipped() -> None:
    plain = build_ladder(100.0, "fp32", ["fp32", "int8"], min_rate_hz=40.0)
    assert [(lv.knob, getattr(lv.knobs, lv.knob)) for lv in plain[1:]] == [
        ("precision", "int8"),  # fp16 did not pass the gate
        ("rate_hz", 50.0),
        ("rate_hz", 40.0),  # down to the floor, not below
    ]
    assert len(build_ladder(100.0, "int8", ["fp32", "int8"], min_rate_hz=100.0)) == 1  # nothing to give up
    assert build_ladder(100.0).__len__() == 3  # default floor: a quarter of the rate
    for bad in (
        lambda: build_ladder(0.0),
        lambda: build_ladder(100.0, "fp16", ["fp32"]),
        lambda: build_ladder(100.0, "bf16"),
        lambda: build_ladder(100.0, min_rate_hz=200.0),
        lambda: build_ladder(100.0, finetune_batch=16, min_finetune_batch=32),
        lambda: GovernorConfig(power_budget_w=-1.0),
        lambda: GovernorConfig(headroom=1.0),
    ):
        with pytest.raises(SacEdgeError):
            bad()


def test_each_degrade_step_in_order_then_each_recovery_in_reverse(tmp_path: Path) -> None:
    board, gov = Board(tmp_path), governor()
    events = []
    for level in range(1, len(LADDER)):
        assert board.tick(gov, 7.5) == [] and board.tick(gov, 7.5) == []  # k - 1 samples: not yet
        (event,) = board.tick(gov, 7.5)
        events.append(event)
        assert (event.kind, event.from_level, event.to_level) == ("degrade", level - 1, level)
        assert gov.knobs == LADDER[level].knobs
    assert [(e.step, e.knob, e.new_value) for e in events] == EXPECTED
    assert "power 7.50 W (measured, ina3221-hwmon) vs budget 6 W" in events[0].reason
    assert events[0].power_w == pytest.approx(7.5, abs=0.01) and events[0].power_measured

    recoveries = []
    for level in range(len(LADDER) - 1, 0, -1):
        for _ in range(4):
            assert board.tick(gov, 4.0) == []
        (event,) = board.tick(gov, 4.0)
        recoveries.append(event)
        assert (event.kind, event.from_level, event.to_level) == ("recover", level, level - 1)
        assert gov.knobs == LADDER[level - 1].knobs
    assert [(e.knob, e.old_value) for e in recoveries] == [(k, v) for _, k, v in reversed(EXPECTED)]
    assert gov.knobs == LADDER[0].knobs and gov.level == 0
    assert len(gov.history) == 2 * (len(LADDER) - 1)
    for event in gov.history:
        json.dumps(event.to_dict())


def test_one_noisy_sample_never_moves_it(tmp_path: Path) -> None:
    board, gov = Board(tmp_path), governor()
    for watts in [7.5, 7.5, 4.0, 7.5, 7.5, 5.0, 9.0, 3.0] * 3:  # never 3 over in a row
        assert board.tick(gov, watts) == []
    for _ in range(3):
        board.tick(gov, 7.5)
    assert gov.level == 1
    for watts in [5.7] * 20 + [4.0] * 4 + [5.9] + [4.0] * 4:  # inside the headroom band, or broken streaks
        assert board.tick(gov, watts) == []
    assert gov.level == 1
    (event,) = board.tick(gov, 4.0)  # the fifth 4.0 W sample in a row since the 5.9 W one
    assert event.kind == "recover" and gov.level == 0


def test_unmeetable_budget_is_reported_once_and_the_governor_keeps_going(tmp_path: Path) -> None:
    board, gov = Board(tmp_path), governor()
    kinds = [e.kind for _ in range(3 * len(LADDER) + 30) for e in board.tick(gov, 12.0)]
    assert kinds == ["degrade"] * (len(LADDER) - 1) + ["unmeetable"]
    (report,) = [e for e in gov.history if e.kind == "unmeetable"]
    assert report.from_level == report.to_level == len(LADDER) - 1 and report.knob is None
    assert "cannot be met at the lowest level 9 (250 Hz, int8, fine-tuning paused)" in report.reason
    assert "power 12.00 W" in report.reason and report.power_budget_w == 6.0
    assert gov.state()["unmeetable"] is True
    for _ in range(5):
        board.tick(gov, 4.0)
    assert gov.level == len(LADDER) - 2 and gov.state()["unmeetable"] is False  # re-armed by meeting the budget


def test_memory_budget_and_estimated_power_are_named_in_the_reason(tmp_path: Path) -> None:
    gov = governor(power_budget_w=None, mem_budget_mb=300.0)
    estimate = PowerReading(9.0, {"cpu": 9.0}, False, "estimate:generic-host", 0.0)
    events = [e for t in range(3) for e in gov.tick(float(t), estimate, 350.0)]
    assert [e.knob for e in events] == ["update_rate_scale"]
    assert "memory over budget" in events[0].reason and "memory 350.00 MB vs budget 300 MB" in events[0].reason

    both = governor(mem_budget_mb=300.0)
    events = [e for t in range(3) for e in both.tick(float(t), estimate, 100.0)]
    assert "(ESTIMATED, estimate:generic-host)" in events[0].reason


def test_an_estimate_over_its_budget_says_so_on_the_terminal_line(tmp_path: Path) -> None:
    """The demo's run at 200 Hz ran at 50 after an estimated 18 W passed its 15 W budget, and the terminal said
    only "(now 50)": each event's line says what changed, the reading and budget, and that it is an estimate."""
    gov = Governor(GovernorConfig(power_budget_w=15.0), build_ladder(200.0))
    estimate = PowerReading(18.2, {"cpu": 18.2}, False, "estimate:generic-host", 0.0)
    events = [e.to_dict() for t in range(3) for e in gov.tick(float(t), estimate, 100.0)]
    line = event_line(events[0])
    assert line.startswith("governor lowered rate_hz 200.0 -> 100.0: power over budget for 3 samples: power 18.20 W")
    assert "(ESTIMATED, estimate:generic-host) vs budget 15 W" in line and "not a measurement" in line
    assert "\n" not in line
    board, measured = Board(tmp_path), governor()
    events = [e.to_dict() for _ in range(3) for e in board.tick(measured, 7.5)]
    assert "measured" in event_line(events[0]) and "not a measurement" not in event_line(events[0])
    low = dataclasses.replace(estimate, total_w=1.0)
    cheap = [e.to_dict() for t in range(5) for e in gov.tick(10.0 + t, low, 100.0)]
    assert event_line(cheap[0]).startswith("governor restored rate_hz 100.0 -> 200.0: under budget")


def test_missing_readings_neither_degrade_nor_recover(tmp_path: Path) -> None:
    board, gov = Board(tmp_path), governor()
    for _ in range(3):
        board.tick(gov, 7.5)
    assert gov.level == 1
    for t in range(20):
        assert gov.tick(100.0 + t, None, float("nan")) == []
    assert gov.level == 1
    assert Governor(GovernorConfig(), LADDER).tick(0.0, None, 1e9) == []  # no budgets: nothing to enforce


def test_memory_alone_over_budget_never_lowers_the_control_rate() -> None:
    gov = governor(power_budget_w=None, mem_budget_mb=300.0)
    events = [e for t in range(3 * len(LADDER) + 30) for e in gov.tick(float(t), None, 900.0)]
    assert "rate_hz" not in [e.knob for e in events] and events[-1].kind == "unmeetable"
    assert gov.knobs.rate_hz == 1000.0 and gov.knobs.precision == "int8" and gov.knobs.finetune_paused
