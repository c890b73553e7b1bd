"""Threat: memory bombs through totals rather than single files. Per-file caps do not bound a bundle of
many large (sparse) files, a JSON file inside a bundle is parsed whole, and a checkpoint's header may
declare a tensor of gigabytes in a sparse file. Each is refused by its size in one line, exit 2, before it
is read, parsed or mapped."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from run_dirs import run_dir_from
from safetensors.numpy import load_file

from bundles import make_bundle
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.export import cli as export_cli

RUN = ["run", "--duration", "0.05", "--backend", "onnxruntime"]


def _list(bundle: Path, name: str, kind: str) -> None:
    """Add ``bundle/name`` to the (unsigned) manifest with its true sha256."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    path = bundle / name
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    manifest["files"][name] = {
        "bytes": path.stat().st_size, "kind": kind, "precision": None, "sha256": digest.hexdigest()
    }  # fmt: skip
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_bundle_holding_more_than_the_total_is_refused_before_reading(
    bundle: Path, refused: Callable[..., str]
) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    size = (1 << 30) // 3 + (1 << 20)  # each under the per-file cap, together over the 1 GiB total
    for i in range(3):
        with open(bundle / f"extra{i}.bin", "wb") as fh:
            fh.truncate(size)  # sparse: a few KB on disk, what it would take in memory once read
        manifest["files"][f"extra{i}.bin"] = {"bytes": size, "kind": "extra", "precision": None, "sha256": "0" * 64}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    err = refused(edge_cli.main, [RUN[0], str(bundle), *RUN[1:]])
    assert "more than 1024 MiB in all" in err and str(bundle) in err


def test_an_envelope_over_the_json_cap_is_refused_before_parsing(tmp_path: Path, refused: Callable[..., str]) -> None:
    bundle = make_bundle(tmp_path / "bundle", int8=None, envelope=True)
    envelope = bundle / "envelope.json"
    text = envelope.read_text().rstrip()
    envelope.write_text(text[:-1] + " " * (17 << 20) + "}")  # valid JSON: parsed whole, it would be accepted
    _list(bundle, "envelope.json", "envelope")
    err = refused(edge_cli.main, [RUN[0], str(bundle), *RUN[1:]])
    assert "envelope.json" in err and "larger than 16.0 MiB" in err


def _sparse_checkpoint(path: Path, tensors: dict[str, np.ndarray], name: str, shape: tuple[int, ...]) -> None:
    """A safetensors file of ``tensors`` whose ``name`` is replaced by a float32 zero tensor of ``shape``,
    stored sparse (a hole), so the file is small on disk."""
    tensors = {k: v for k, v in tensors.items() if k != name}
    header: dict[str, object] = {}
    offset = 0
    for key, value in tensors.items():
        code = {"float32": "F32", "float64": "F64", "int64": "I64"}[value.dtype.name]
        header[key] = {"dtype": code, "shape": list(value.shape), "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    huge = int(np.prod(shape)) * 4
    header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + huge]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        for value in tensors.values():
            fh.write(np.ascontiguousarray(value).tobytes())
        fh.truncate(fh.tell() + huge)


def test_a_checkpoint_declaring_a_gigabyte_tensor_is_refused_before_mapping(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    run = run_dir_from(clean_bundle, tmp_path)
    tensors = load_file(run / "checkpoint.safetensors")
    _sparse_checkpoint(run / "checkpoint.safetensors", tensors, "actor.mu.weight", (1, 1 << 28))  # 1 GiB
    assert (run / "checkpoint.safetensors").stat().st_blocks * 512 < 16 << 20
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "bundle")], prog="sac-export")
    assert "tensor actor.mu.weight declares 268435456 values" in err, repr(err)
    assert not (tmp_path / "bundle").exists()
