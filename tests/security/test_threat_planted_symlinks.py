"""Threat: symlinks planted where sac-edge writes a new file or reads a run dir. ``sac-edge keygen`` never
writes through a symlink (a dangling one included: it would create the file it points to), and
``sac-export`` never reads a run dir's files through a symlink to a file outside it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from run_dirs import run_dir_from

from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.export import cli as export_cli


@pytest.mark.parametrize("planted", ["fleet", "fleet.pub"])
def test_keygen_never_writes_through_a_dangling_symlink(
    tmp_path: Path, refused: Callable[..., str], planted: str
) -> None:
    target = tmp_path / "elsewhere" / "authorized_keys"
    target.parent.mkdir()
    os.symlink(target, tmp_path / planted)
    err = refused(edge_cli.main, ["keygen", str(tmp_path / "fleet")])
    assert "already exists" in err and planted in err
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", planted]


def test_keygen_writes_both_keys_with_their_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert edge_cli.main(["keygen", str(tmp_path / "fleet")]) == 0
    assert (tmp_path / "fleet").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "fleet.pub").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet", "fleet.pub"]


@pytest.mark.parametrize("name", ["checkpoint.safetensors", "config.json"])
def test_export_never_reads_a_run_dir_file_through_a_symlink(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str], name: str
) -> None:
    run = run_dir_from(clean_bundle, tmp_path)
    outside = tmp_path / "someone-elses" / name
    outside.parent.mkdir()
    shutil.move(run / name, outside)  # a valid file: followed, it would be exported
    os.symlink(outside, run / name)
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "bundle")], prog="sac-export")
    assert "symlink" in err and name in err
    assert not (tmp_path / "bundle").exists()
