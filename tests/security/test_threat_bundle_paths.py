"""Manifest file names must not reach outside the bundle, and the manifest's schema is checked.

Every name is refused unless it is a plain relative path that stays in the bundle after symlinks are
resolved, before any file is opened: otherwise the checksum check reads (and its error confirms hash
guesses for) any file the process can read, and a bundle could serve a graph from elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.manifest import file_entry, sha256_file
from sac_edge.edge_runtime import cli as edge_cli


def _edit(bundle: Path, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    atomic_write_json(bundle / "manifest.json", manifest)


def _outside(tmp_path: Path) -> Path:
    """A readable file outside the bundle, whose hash an attacker knows."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not for bundles\n")
    return secret


@pytest.mark.parametrize("style", ["dotdot", "absolute", "dot", "backslash"])
def test_manifest_name_escaping_the_bundle_is_refused(
    bundle: Path, tmp_path: Path, refused: Callable[..., str], style: str
) -> None:
    secret = _outside(tmp_path)
    name = {
        "dotdot": "../secret.txt",
        "absolute": str(secret),
        "dot": "./policy.onnx",
        "backslash": "..\\secret.txt",
    }[style]

    def add(m: dict[str, Any]) -> None:
        m["files"][name] = {"sha256": sha256_file(secret), "bytes": 16, "kind": "config", "precision": None}

    _edit(bundle, add)
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])
    assert "outside the bundle" in err or "not a plain relative path" in err


def test_wrong_hash_for_an_outside_file_is_no_hash_oracle(
    bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    secret = _outside(tmp_path)

    def add(m: dict[str, Any]) -> None:
        m["files"]["../secret.txt"] = {"sha256": "0" * 64, "bytes": 16, "kind": "config", "precision": None}

    _edit(bundle, add)
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])
    assert "outside the bundle" in err and "checksum" not in err and sha256_file(secret) not in err


def test_onnx_entry_pointing_at_another_bundle_is_refused(
    bundle: Path, clean_bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    other = Path(shutil.copytree(clean_bundle, tmp_path / "other"))

    def point(m: dict[str, Any]) -> None:
        m["files"]["../other/policy.onnx"] = m["files"].pop("policy.onnx")

    _edit(bundle, point)
    assert (other / "policy.onnx").is_file()
    assert "outside the bundle" in refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])


def test_symlink_leaving_the_bundle_is_refused(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    outside = tmp_path / "elsewhere.onnx"
    shutil.copyfile(bundle / "policy.onnx", outside)
    (bundle / "policy.onnx").unlink()
    os.symlink(outside, bundle / "policy.onnx")  # same bytes, same hash: only the resolved path tells
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])
    assert "leads outside the bundle" in err


def test_symlink_inside_the_bundle_is_accepted(bundle: Path) -> None:
    (bundle / "sub").mkdir()
    shutil.move(bundle / "policy.onnx", bundle / "sub" / "policy.onnx")
    os.symlink("sub/policy.onnx", bundle / "policy.onnx")
    assert edge_cli.main(["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime"]) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.__setitem__("files", ["policy.onnx"]), "must be JSON objects"),
        (lambda m: m.__setitem__("spec", "Pendulum-v1"), "must be JSON objects"),
        (lambda m: m["files"].__setitem__("policy.onnx", "abc"), "is not a JSON object"),
        (lambda m: m["files"]["policy.onnx"].__setitem__("sha256", 5), "no hex sha256"),
        (lambda m: m["files"]["policy.onnx"].__setitem__("sha256", "Z" * 64), "no hex sha256"),
        (lambda m: m["files"]["policy.onnx"].__setitem__("bytes", -1), "bad byte count"),
        (lambda m: m["files"]["policy.onnx"].__setitem__("kind", {"x": 1}), "string kind"),
        (lambda m: m.__setitem__("format_version", "1"), "format_version"),
        (
            lambda m: m["files"].update(
                {f"f{i}": {"sha256": "0" * 64, "bytes": 0, "kind": "x", "precision": None} for i in range(300)}
            ),
            "more than 256",
        ),
    ],
)
def test_malformed_manifest_is_one_line_exit_2(
    bundle: Path, refused: Callable[..., str], change: Callable[[dict[str, Any]], None], message: str
) -> None:
    _edit(bundle, change)
    assert message in refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])


def test_deeply_nested_manifest_is_one_line_exit_2(bundle: Path, refused: Callable[..., str]) -> None:
    (bundle / "manifest.json").write_text('{"files": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested too deeply" in refused(edge_cli.main, ["run", str(bundle)])


def test_oversized_manifest_is_refused_before_it_is_read(bundle: Path, refused: Callable[..., str]) -> None:
    with open(bundle / "manifest.json", "ab") as fh:
        fh.truncate(8 << 20)  # sparse: 8 MiB of NULs after the JSON
    assert "larger than" in refused(edge_cli.main, ["run", str(bundle)])


def test_bench_refuses_escaping_names_too(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    secret = _outside(tmp_path)
    _edit(bundle, lambda m: m["files"].__setitem__("../secret.txt", file_entry(tmp_path, "secret.txt", kind="x")))
    assert secret.is_file()
    assert "outside the bundle" in refused(edge_cli.main, ["bench", str(bundle), "--calls", "1"])
