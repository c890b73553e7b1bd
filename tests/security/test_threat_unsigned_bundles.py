"""Signed bundles: with ``--trusted-keys DIR`` only a bundle whose manifest is signed by one of the keys in
DIR runs; a bundle changed after signing (any file, checksum or the manifest) or signed by another key is
refused in one line. Without ``--trusted-keys`` behaviour is unchanged."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.manifest import file_entry
from sac_edge.common.signing import (
    INVALID,
    SIGNED,
    TRUSTED,
    UNKNOWN_KEY,
    UNSIGNED,
    generate_keypair,
    load_private_key,
    sign_bundle,
    signature_state,
)
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.export import cli as export_cli


def _run(bundle: Path, trusted: Path) -> list[str]:
    return ["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime", "--trusted-keys", str(trusted)]


def test_signed_bundle_runs_with_trusted_keys(bundle: Path, keys: tuple[Path, Path]) -> None:
    private, trusted = keys
    sign_bundle(bundle, load_private_key(private))
    assert signature_state(bundle, trusted).state == TRUSTED
    assert signature_state(bundle).state == SIGNED
    assert edge_cli.main(_run(bundle, trusted)) == 0


def test_unsigned_bundle_is_refused_with_trusted_keys(
    bundle: Path, keys: tuple[Path, Path], refused: Callable[..., str]
) -> None:
    assert signature_state(bundle).state == UNSIGNED
    assert "no manifest.sig" in refused(edge_cli.main, _run(bundle, keys[1]))
    assert edge_cli.main(["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime"]) == 0


def test_manifest_changed_after_signing_is_refused(
    bundle: Path, keys: tuple[Path, Path], refused: Callable[..., str]
) -> None:
    sign_bundle(bundle, load_private_key(keys[0]))
    (bundle / "policy.onnx").write_bytes((bundle / "policy.onnx").read_bytes() + b"\0")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["policy.onnx"] = file_entry(bundle, "policy.onnx", kind="onnx", precision="fp32")
    atomic_write_json(bundle / "manifest.json", manifest)  # checksums re-made: only the signature tells
    assert signature_state(bundle, keys[1]).state == INVALID
    assert "does not match manifest.json" in refused(edge_cli.main, _run(bundle, keys[1]))


def test_file_changed_after_signing_is_refused_by_checksum(
    bundle: Path, keys: tuple[Path, Path], refused: Callable[..., str]
) -> None:
    sign_bundle(bundle, load_private_key(keys[0]))
    (bundle / "policy.onnx").write_bytes((bundle / "policy.onnx").read_bytes() + b"\0")
    assert "checksum mismatch" in refused(edge_cli.main, _run(bundle, keys[1]))


def test_bundle_signed_by_another_key_is_refused(
    bundle: Path, keys: tuple[Path, Path], tmp_path: Path, refused: Callable[..., str]
) -> None:
    other, _ = generate_keypair(tmp_path / "intruder")
    sign_bundle(bundle, load_private_key(other))
    assert signature_state(bundle, keys[1]).state == UNKNOWN_KEY
    assert "not among the trusted keys" in refused(edge_cli.main, _run(bundle, keys[1]))
    assert "not among the trusted keys" in refused(
        edge_cli.main, ["bench", str(bundle), "--trusted-keys", str(keys[1])]
    )


@pytest.mark.parametrize(
    "garbage",
    [
        '{"algorithm": "ed25519", "key_id": 1}',
        '{"algorithm": "ed25519", "key_id": "ab", "signature": "!!"}',
        "not json",
    ],
)
def test_malformed_signature_is_refused(
    bundle: Path, keys: tuple[Path, Path], refused: Callable[..., str], garbage: str
) -> None:
    (bundle / "manifest.sig").write_text(garbage)
    assert signature_state(bundle, keys[1]).state == INVALID
    refused(edge_cli.main, _run(bundle, keys[1]))


def test_trusted_keys_dir_without_keys_is_one_line(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no *.pub public keys" in refused(edge_cli.main, _run(bundle, empty))
    (empty / "bad.pub").write_text("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
    assert "not a PEM public key" in refused(edge_cli.main, _run(bundle, empty))


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path, refused: Callable[..., str]) -> None:
    assert edge_cli.main(["keygen", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k.pub").is_file() and os.stat(tmp_path / "k").st_mode & 0o077 == 0
    assert "already exists" in refused(edge_cli.main, ["keygen", str(tmp_path / "k")])


def test_sac_export_sign_key_is_checked_before_export(tmp_path: Path, refused: Callable[..., str]) -> None:
    (tmp_path / "key").write_text("not a key")
    err = refused(
        export_cli.main,
        [str(tmp_path / "no-run"), "--out", str(tmp_path / "b"), "--sign-key", str(tmp_path / "key")],
        prog="sac-export",
    )
    assert "not an unencrypted PEM private key" in err
