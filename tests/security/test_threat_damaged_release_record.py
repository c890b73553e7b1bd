"""Threat: the device's record of accepted releases damaged or replaced (not JSON, a list, deleted, a
symlink, a FIFO, wrong types, huge). Read as "empty", it would let a replayed old signed bundle run and be
written back as the newest; a security record that cannot be read refuses instead, in one line naming the
file and ``--allow-downgrade``, which accepts the bundle and writes a fresh record in its place."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from test_threat_replayed_bundles import _release, _run

from sac_edge.common.releases import RECORD, state_dir
from sac_edge.edge_runtime import cli as edge_cli


def _damage(record: Path, how: str, elsewhere: Path) -> None:
    good = record.read_text()
    record.unlink()
    if how == "not JSON":
        record.write_text(good[: len(good) // 2])
    elif how == "a list":
        record.write_text(json.dumps([json.loads(good)]))
    elif how == "a string release":
        record.write_text(json.dumps({k: {"release": str(v["release"])} for k, v in json.loads(good).items()}))
    elif how == "a symlink":
        elsewhere.write_text(good)
        os.symlink(elsewhere, record)
    elif how == "a FIFO":
        os.mkfifo(record)
    elif how == "over 16 MiB":
        with open(record, "w") as fh:
            fh.write(good)
            fh.truncate(17 << 20)
    # "deleted": nothing put back


@pytest.mark.parametrize(
    "how", ["not JSON", "a list", "a string release", "deleted", "a symlink", "a FIFO", "over 16 MiB"]
)
def test_a_damaged_record_refuses_the_replayed_bundle(
    bundle: Path, tmp_path: Path, keys: tuple[Path, Path], refused: Callable[..., str], how: str
) -> None:
    private, trusted = keys
    old = _release(bundle, 1000, private, tmp_path / "old")
    new = _release(bundle, 2000, private, tmp_path / "new")
    assert edge_cli.main(_run(new, trusted)) == 0
    record, elsewhere = state_dir() / RECORD, tmp_path / "elsewhere.json"
    _damage(record, how, elsewhere)
    err = refused(edge_cli.main, _run(old, trusted))
    assert str(record) in err and "--allow-downgrade" in err, err
    if how == "a symlink":
        kept = elsewhere.read_text()
    assert edge_cli.main(_run(old, trusted, "--allow-downgrade")) == 0  # on purpose: a fresh record
    assert record.is_file() and not record.is_symlink()
    assert [entry["release"] for entry in json.loads(record.read_text()).values()] == [1000]
    if how == "a symlink":
        assert elsewhere.read_text() == kept  # replaced, never written through
    assert edge_cli.main(_run(new, trusted)) == 0


def test_the_first_signed_bundle_on_a_device_starts_the_record(
    bundle: Path, tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    private, trusted = keys
    assert not (state_dir() / RECORD).exists()
    assert edge_cli.main(_run(_release(bundle, 1000, private, tmp_path / "b"), trusted)) == 0
    assert (state_dir() / RECORD).is_file()
