"""A process killed mid-write leaves temp files and partial bundles; the next write of the same
target removes those whose writer is gone, and never a live writer's."""

from __future__ import annotations

import os
from pathlib import Path

from sac_edge.common.atomic import atomic_dir, atomic_write_json

DEAD = 999_999_999  # above any pid_max: no such process


def test_leftover_temp_file_of_a_killed_writer_is_cleaned_on_the_next_write(tmp_path: Path) -> None:
    stale = tmp_path / f".last_good.json.{DEAD}.k3j4.tmp"
    live = tmp_path / f".last_good.json.{os.getpid()}.a1b2.tmp"
    other = tmp_path / f".other.json.{DEAD}.zz.tmp"
    for path in (stale, live, other):
        path.write_text("half")
    atomic_write_json(tmp_path / "last_good.json", {"ok": True})
    assert not stale.exists() and live.exists() and other.exists()


def test_partial_bundle_of_a_killed_export_is_cleaned_on_the_next_export(tmp_path: Path) -> None:
    partial = tmp_path / f".bundle.{DEAD}.0badf00d.partial"
    (partial / "sub").mkdir(parents=True)
    (partial / "sub" / "policy.onnx").write_bytes(b"x" * 1000)
    old = tmp_path / f".bundle.{DEAD}.0badf00d.old"
    old.mkdir()
    unrelated = tmp_path / ".bundle-notes"
    unrelated.write_text("not ours")
    with atomic_dir(tmp_path / "bundle") as stage:
        (stage / "manifest.json").write_text("{}")
    assert not partial.exists() and not old.exists() and unrelated.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bundle-notes", "bundle"]
