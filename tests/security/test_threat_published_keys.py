"""Threat: a private signing key published by a commit. ``sac-edge keygen DIR/NAME`` makes the missing folders
(0700) and warns in one line when the private key lands in a git work tree that does not ignore it; README
and EXAMPLES write keys outside the clone. (On 27d6dc3 ``keygen keys/fleet`` in a fresh clone failed until
``keys/`` existed, then left the key where ``git add .`` takes it.)"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.edge_runtime import cli as edge_cli

ROOT = Path(__file__).resolve().parents[2]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_keygen_makes_the_missing_folders_for_its_owner_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert edge_cli.main(["keygen", str(tmp_path / "keys" / "fleet" / "robot1")]) == 0
    for folder in (tmp_path / "keys", tmp_path / "keys" / "fleet"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert sorted(p.name for p in (tmp_path / "keys" / "fleet").iterdir()) == ["robot1", "robot1.pub"]
    assert capsys.readouterr().err == ""  # not in a git work tree: nothing to warn about


def test_keygen_under_a_file_is_one_line(tmp_path: Path, refused: Callable[..., str]) -> None:
    (tmp_path / "keys").write_text("not a folder")
    err = refused(edge_cli.main, ["keygen", str(tmp_path / "keys" / "fleet")])
    assert "keys is not a directory" in err


@needs_git
def test_keygen_warns_when_git_would_commit_the_private_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert edge_cli.main(["keygen", str(tmp_path / "keys" / "fleet")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "warning: the private key" in err[0] and f"work tree {tmp_path}" in err[0], err
    (tmp_path / ".gitignore").write_text("secrets/\n")
    assert edge_cli.main(["keygen", str(tmp_path / "secrets" / "fleet")]) == 0
    assert capsys.readouterr().err == ""  # ignored: git never takes it


def test_the_examples_keep_keys_out_of_the_clone() -> None:
    for doc in ("README.md", "docs/EXAMPLES.md"):
        lines = [line for line in (ROOT / doc).read_text().splitlines() if "keygen " in line]
        assert lines and all("keygen ~/" in line for line in lines), (doc, lines)
