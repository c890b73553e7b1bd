"""A ``--trusted-keys`` directory with more public keys than sac-edge reads (1000): the keys past the 1000th
were dropped silently, so a bundle signed by one of them was refused as "not among the trusted keys" (or, with
an attacker's 1000 keys sorted first, the device's own key was never read). Now such a directory is refused in
one line that says why."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from sac_edge.common.signing import MAX_TRUSTED_KEYS, generate_keypair, load_private_key, sign_bundle
from sac_edge.edge_runtime import cli as edge_cli


def test_keys_past_the_limit_are_refused_not_dropped(
    bundle: Path, keys: tuple[Path, Path], tmp_path: Path, refused: Callable[..., str]
) -> None:
    private, trusted = keys
    sign_bundle(bundle, load_private_key(private))
    _, other = generate_keypair(tmp_path / "other")
    for i in range(MAX_TRUSTED_KEYS):  # sorted before the fleet's key, which is the 1001st
        shutil.copyfile(other, trusted / f"a{i:04d}.pub")
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.05", "--trusted-keys", str(trusted)])
    assert f"holds {MAX_TRUSTED_KEYS + 1} *.pub files, more than the {MAX_TRUSTED_KEYS} read" in err


def test_exactly_the_limit_still_runs(bundle: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    private, trusted = keys
    sign_bundle(bundle, load_private_key(private))
    _, other = generate_keypair(tmp_path / "other")
    for i in range(MAX_TRUSTED_KEYS - 1):
        shutil.copyfile(other, trusted / f"a{i:04d}.pub")
    argv = ["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime", "--trusted-keys", str(trusted)]
    assert edge_cli.main(argv) == 0
