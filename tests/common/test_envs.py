"""Environment lookup: MuJoCo's warnings become sac-edge lines, and nothing is written to the cwd."""

from __future__ import annotations

from pathlib import Path

import pytest

from sac_edge.common.envs import make_env


def test_a_mujoco_env_writes_no_log_file_and_prints_no_deprecation_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("mujoco")
    monkeypatch.chdir(tmp_path)
    env = make_env("HalfCheetah-v5")  # its XML uses the deprecated 'settotalmass'
    env.reset(seed=0)
    env.close()
    out, err = capfd.readouterr()
    assert "settotalmass" not in out + err
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
