"""Threat: two writers of one output (two ``sac-export --out X`` at once, a script and a person). The
existence check and the final rename are one operation (``common.atomic.rename_noreplace``): the later
writer loses with one line and never moves aside or deletes what the earlier one wrote, with or without
``--force``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_dirs import run_dir_from

from sac_edge.common.atomic import atomic_dir, atomic_path
from sac_edge.common.errors import SacEdgeError


def _other_writer(path: Path) -> None:
    """What a concurrent writer leaves at ``path`` while this one is still writing."""
    path.mkdir()
    (path / "manifest.json").write_text('{"theirs": true}')


def test_a_bundle_written_meanwhile_is_never_replaced(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    with pytest.raises(SacEdgeError, match="written by another writer while this one ran"), atomic_dir(out) as stage:
        (stage / "manifest.json").write_text('{"ours": true}')
        _other_writer(out)
    assert (out / "manifest.json").read_text() == '{"theirs": true}'
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]  # no staging or moved-aside copy left


def test_force_replaces_only_the_bundle_that_was_there_when_it_began(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "manifest.json").write_text('{"old": true}')
    with pytest.raises(SacEdgeError, match="written by another writer"), atomic_dir(out, replace=True) as stage:
        (stage / "manifest.json").write_text('{"ours": true}')
        os.rename(out, tmp_path / "elsewhere")  # the other --force writer swapped its bundle in
        _other_writer(out)
    assert (out / "manifest.json").read_text() == '{"theirs": true}'
    with atomic_dir(out, replace=True) as stage:  # no one else writing: --force replaces as before
        (stage / "manifest.json").write_text('{"ours": true}')
    assert (out / "manifest.json").read_text() == '{"ours": true}'


@pytest.mark.parametrize("planted", ["file", "dangling symlink"])
def test_a_file_claim_never_replaces_nor_follows(tmp_path: Path, planted: str) -> None:
    out, target = tmp_path / "drill.json", tmp_path / "outside" / "victim"
    with pytest.raises(SacEdgeError, match="written by another writer"), atomic_path(out, replace=False) as tmp:
        tmp.write_text("ours")
        if planted == "file":
            out.write_text("theirs")
        else:
            out.symlink_to(target)
    assert out.read_text() == "theirs" if planted == "file" else out.is_symlink() and not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drill.json"]


def test_two_exports_to_one_out_one_wins_the_other_says_so(clean_bundle: Path, tmp_path: Path) -> None:
    run = run_dir_from(clean_bundle, tmp_path)
    out = tmp_path / "bundle"
    argv = [str(Path(sys.executable).with_name("sac-export")), str(run), "--out", str(out), "--parity-states", "512"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    err = next(e for rc, e in results if rc == 2).strip()
    assert len(err.splitlines()) == 1 and err.startswith("sac-export: ") and str(out) in err, err
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bundle")] == []
    from sac_edge.common.manifest import read_manifest

    assert read_manifest(out)["spec"]["env_id"] == "Pendulum-v1"
