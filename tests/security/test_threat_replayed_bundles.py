"""Threat: an old, known-bad signed bundle replayed over a newer one. Every manifest carries a ``release``
that only grows and is covered by the signature; under ``--trusted-keys`` the device remembers the newest
release it accepted from each key and refuses an older one unless ``--allow-downgrade``."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

from sac_edge.common.releases import RECORD, state_dir
from sac_edge.common.signing import load_private_key, sign_bundle
from sac_edge.edge_runtime import cli as edge_cli


def _release(bundle: Path, release: int | None, key: Path, dest: Path) -> Path:
    """A copy of ``bundle`` whose manifest says ``release`` (None: none), signed by ``key``."""
    out = Path(shutil.copytree(bundle, dest))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("release", None)
    if release is not None:
        manifest["release"] = release
    (out / "manifest.json").write_text(json.dumps(manifest))
    sign_bundle(out, load_private_key(key))
    return out


def _run(bundle: Path, trusted: Path, *extra: str) -> list[str]:
    return [
        "run",
        str(bundle),
        "--duration",
        "0.05",
        "--backend",
        "onnxruntime",
        "--trusted-keys",
        str(trusted),
        *extra,
    ]


def test_an_older_release_is_refused_after_a_newer_one(
    bundle: Path, tmp_path: Path, keys: tuple[Path, Path], refused: Callable[..., str]
) -> None:
    private, trusted = keys
    old = _release(bundle, 1000, private, tmp_path / "old")
    new = _release(bundle, 2000, private, tmp_path / "new")
    unversioned = _release(bundle, None, private, tmp_path / "unversioned")
    assert edge_cli.main(_run(old, trusted)) == 0
    assert edge_cli.main(_run(new, trusted)) == 0
    err = refused(edge_cli.main, _run(old, trusted))
    assert "release 1000 is older than release 2000" in err and "--allow-downgrade" in err
    assert "release 0 is older" in refused(edge_cli.main, _run(unversioned, trusted))
    assert edge_cli.main(_run(new, trusted)) == 0  # the same release again is fine


def test_a_downgrade_on_purpose_runs_and_keeps_the_newest_record(
    bundle: Path, tmp_path: Path, keys: tuple[Path, Path], refused: Callable[..., str]
) -> None:
    private, trusted = keys
    old = _release(bundle, 1000, private, tmp_path / "old")
    new = _release(bundle, 2000, private, tmp_path / "new")
    assert edge_cli.main(_run(new, trusted)) == 0
    assert edge_cli.main(_run(old, trusted, "--allow-downgrade")) == 0
    assert "older than release 2000" in refused(edge_cli.main, _run(old, trusted))
    record = json.loads((state_dir() / RECORD).read_text())
    assert [entry["release"] for entry in record.values()] == [2000]
