"""``sac-edge replay`` end to end on HalfCheetah recordings made with MuJoCo (recordings.py): each robot-side
fault named with its joints (exit 3), a clean robot agrees (exit 0), bad input is one line (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from docs_tables import documented
from recordings import FAULTS, halfcheetah_bundle

from sac_edge.edge_runtime.cli import main
from sac_edge.edge_runtime.replay.findings import KINDS


def replay(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["replay", *argv, "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return code, json.loads(out[-1])


def test_a_clean_robot_agrees(
    cheetah_bundle: Path, recordings: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = replay(capsys, str(cheetah_bundle), str(recordings["clean"]))
    assert code == 0, report["findings"]
    assert report["verdict"] == "agree" and report["findings"] == []
    assert report["steps"] == report["commands_compared"] == 1000
    actions = report["actions"]
    assert set(actions) == {"bthigh", "bshin", "bfoot", "fthigh", "fshin", "ffoot"}
    for row in actions.values():
        # the robot sent the policy's command plus exploration noise of std 0.2: they follow each other
        assert 0.05 < row["divergence"]["p50"] < 0.3 and row["correlation"] > 0.05
    assert report["timing"]["period_ms"] == pytest.approx(50.0)
    assert documented("sac-edge replay --json") - {"vs"} == set(report)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_robot_fault_is_named_with_its_joints(
    fault: str, cheetah_bundle: Path, recordings: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = replay(capsys, str(cheetah_bundle), str(recordings[fault]))
    kind, joints = FAULTS[fault][1]
    assert code == 3 and report["verdict"] == "mismatch"
    named = [(f["kind"], set(f["joints"])) for f in report["findings"]]
    assert all(f["kind"] in KINDS for f in report["findings"])
    if joints is None:  # a gap in the state stream concerns every joint
        assert [k for k, _ in named] == [kind]
    else:
        assert named == [(kind, joints)], report["findings"]


def test_the_swap_is_told_from_the_state_values(
    cheetah_bundle: Path, recordings: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """With commands: the JointState's values are exchanged (not the command's channels). Without the
    command topic: still named, from the training distribution alone."""
    _, report = replay(capsys, str(cheetah_bundle), str(recordings["swap"]))
    assert "JointState's values of bthigh and fthigh are exchanged" in report["findings"][0]["detail"]
    code, report = replay(capsys, str(cheetah_bundle), str(recordings["swap"]), "--command-topic", "/none")
    assert code == 3 and report["commands_compared"] == 0 and not report["command_topic_in_log"]
    assert [(f["kind"], set(f["joints"])) for f in report["findings"]] == [("swapped", {"bthigh", "fthigh"})]


def test_the_scale_names_the_unit(
    cheetah_bundle: Path, recordings: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, report = replay(capsys, str(cheetah_bundle), str(recordings["deg_velocity"]))
    assert "deg/s for rad/s" in report["findings"][0]["detail"]


def test_a_rosbag2_directory_is_read(
    cheetah_bundle: Path, recordings: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "bag"
    bag.mkdir()
    shutil.copy(recordings["flip_command"], bag / "bag_0.mcap")
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information:\n  storage_identifier: mcap\n")
    code, report = replay(capsys, str(cheetah_bundle), str(bag))
    assert code == 3 and [f["kind"] for f in report["findings"]] == ["sign"]


def test_plot_and_vs(
    cheetah_bundle: Path, recordings: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--plot writes a PNG; --vs on the same bundle diverges nowhere, on other weights it does, per joint."""
    png = tmp_path / "replay.png"
    same = shutil.copytree(cheetah_bundle, tmp_path / "same")
    code, report = replay(capsys, str(cheetah_bundle), str(recordings["clean"]), "--vs", str(same), "--plot", str(png))
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    vs = report["vs"]
    assert vs["bundle"] == str(same) and set(vs["divergence"]) == set(report["actions"])
    assert all(row["max"] == 0.0 for row in vs["divergence"].values())
    assert set(vs["shield"]) == {str(cheetah_bundle), str(same)}
    other = halfcheetah_bundle(tmp_path / "other", seed=1, training=False)
    _, report = replay(capsys, str(cheetah_bundle), str(recordings["clean"]), "--vs", str(other))
    assert all(row["p50"] > 0 for row in report["vs"]["divergence"].values())


def _bad(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["replay", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_input_is_one_line(
    cheetah_bundle: Path,
    pendulum_bundle: Path,
    recordings: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bundle, clean = str(cheetah_bundle), str(recordings["clean"])
    assert "--state-topic /joint_states" in _bad(capsys, bundle, clean, "--state-topic", "/js")
    not_mcap = tmp_path / "x.mcap"
    not_mcap.write_bytes(b"not an mcap file at all")
    assert "not an MCAP file" in _bad(capsys, bundle, str(not_mcap))
    link = tmp_path / "link.mcap"
    link.symlink_to(recordings["clean"])
    assert "symlink" in _bad(capsys, bundle, str(link))
    assert "no such file" in _bad(capsys, bundle, str(tmp_path / "missing.mcap"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no .mcap file" in _bad(capsys, bundle, str(empty))
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"x")
    assert "--overwrite" in _bad(capsys, bundle, clean, "--plot", str(taken))
    assert "std_msgs/msg/Float64MultiArray" in _bad(capsys, bundle, clean, "--command-topic", "/joint_states")
    assert "sac-export --layout" in _bad(capsys, str(pendulum_bundle), clean)
    assert "no layout.json" in _bad(capsys, bundle, clean, "--vs", str(pendulum_bundle))
