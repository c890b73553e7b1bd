"""Threat: a bundle or fine-tuning directory whose entries are symlinks or FIFOs. What the runtime writes
there (the fine-tuning lock, the weights and their sidecars, telemetry) is opened without following a
symlink and only as a regular file, ``BUNDLE/finetune`` itself must be a real directory, and what it reads
there is a regular file: nothing outside is overwritten, and a FIFO never blocks a start."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.bundle_format import LAST_GOOD_INFO
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore

PRECIOUS = "someone's file, not sac-edge's\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(PRECIOUS)
    return victim


def test_a_symlinked_lock_never_writes_its_target(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    victim = _victim(tmp_path)
    (bundle / "finetune").mkdir()
    os.symlink(victim, bundle / "finetune" / "lock")
    err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])
    assert "symlink" in err and "lock" in err
    assert victim.read_text() == PRECIOUS


def test_a_fifo_lock_is_refused_without_blocking(bundle: Path, refused: Callable[..., str]) -> None:
    (bundle / "finetune").mkdir()
    os.mkfifo(bundle / "finetune" / "lock")
    assert "not a regular file" in refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])


def test_a_symlinked_finetune_dir_is_refused(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, bundle / "finetune")
    err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])
    assert "symlink" in err and "--finetune-dir" in err
    assert list(outside.iterdir()) == []


def _save(store: LastGoodStore) -> None:
    weights = {"actor.mu.weight": np.full((1, 8), 0.1, np.float32), "log_alpha": np.zeros(1)}
    store.save(weights, np.zeros((2, 3), np.float32), {"generation": 3, "step": 3})


@pytest.mark.timeout(60)
def test_a_fifo_sidecar_does_not_block_resume(
    clean_finetune_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.numpy import load_file

    bundle = Path(shutil.copytree(clean_finetune_bundle, tmp_path / "b"))
    store = LastGoodStore(bundle / "finetune")
    store.save(load_file(str(bundle / "learner.safetensors")), np.zeros((0, 3), np.float32), {"generation": 3})
    store.info_path.unlink()
    os.mkfifo(bundle / "finetune" / LAST_GOOD_INFO)  # nobody ever writes into it
    rc = edge_cli.main(["run", str(bundle), "--resume", "--duration", "0.1", "--backend", "onnxruntime"])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.timeout(60)
def test_fifo_or_symlinked_weights_are_refused(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    store = LastGoodStore(bundle / "finetune")
    store.dir.mkdir()
    os.mkfifo(store.path)
    assert "not a regular file" in refused(edge_cli.main, ["run", str(bundle), "--resume", "--duration", "0.1"])
    store.path.unlink()
    elsewhere = LastGoodStore(tmp_path / "elsewhere")
    _save(elsewhere)
    os.symlink(elsewhere.path, store.path)  # intact weights, but outside the bundle
    assert "symlink" in refused(edge_cli.main, ["run", str(bundle), "--resume", "--duration", "0.1"])


def test_telemetry_is_never_written_through_a_symlink(
    bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    victim = _victim(tmp_path)
    link = tmp_path / "telemetry.jsonl"
    os.symlink(victim, link)
    base = ["run", str(bundle), "--duration", "0.1", "--telemetry", str(link)]
    assert "already exists" in refused(edge_cli.main, base)
    assert "symlink" in refused(edge_cli.main, [*base, "--overwrite-telemetry"])
    assert victim.read_text() == PRECIOUS
