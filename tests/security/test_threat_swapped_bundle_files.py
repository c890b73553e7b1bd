"""Threat: bundle bytes served that nobody verified. ``open_bundle`` checks the signature and every sha256;
the backends then load exactly those bytes from memory, so a file swapped on disk after the check (a
shared mount, a USB stick written while the run starts) is never served. A graph whose weights live in an
external-data file beside it (not listed, so neither hashed nor signed) is refused."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from sac_edge.common.bundle import open_bundle, reopen_bundle
from sac_edge.common.bundle_format import POLICY_ONNX
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.manifest import file_entry
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.backends.registry import open_backend


def _saturating(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with its output layer's weights x 1000 (every action at a bound)."""
    hostile = onnx.ModelProto()
    hostile.CopyFrom(model)
    for init in hostile.graph.initializer:
        if init.name.startswith("actor.mu."):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1000, init.name))
    return hostile


def test_a_graph_swapped_after_verification_is_not_served(bundle: Path) -> None:
    opened = open_bundle(bundle)  # verified here
    honest = open_backend(opened, "onnxruntime", "fp32")
    obs = np.linspace(-1, 1, opened.spec.obs_dim, dtype=np.float32)
    want = honest.act(obs).copy()
    honest.close()
    graph = bundle / "policy.onnx"
    graph.write_bytes(_saturating(onnx.load(str(graph))).SerializeToString())  # swapped in between
    served = open_backend(opened, "onnxruntime", "fp32")
    np.testing.assert_array_equal(served.act(obs), want)
    served.close()


def test_external_data_beside_the_graph_is_refused(bundle: Path, refused: Callable[..., str]) -> None:
    graph = bundle / "policy.onnx"
    model = onnx.load(str(graph))
    onnx.save_model(
        _saturating(model), str(graph), save_as_external_data=True, location="weights.bin", size_threshold=0
    )
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["policy.onnx"] = file_entry(bundle, "policy.onnx", kind="onnx", precision="fp32")
    (bundle / "manifest.json").write_text(json.dumps(manifest))  # the graph's checksum is right again
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime"])
    assert "external data" in err and "weights.bin" in err


def test_a_bundle_reopened_in_the_learner_process_is_verified_again(bundle: Path) -> None:
    """The learner process reads the bundle again (its int8 re-check): it takes only the manifest the run
    opened, and only files whose sha256 still matches it."""
    opened = open_bundle(bundle)
    again = reopen_bundle(bundle, opened.manifest, opened.spec)
    assert again.read(bundle / POLICY_ONNX) == opened.read(bundle / POLICY_ONNX)
    graph = bundle / POLICY_ONNX
    graph.write_bytes(_saturating(onnx.load(str(graph))).SerializeToString())
    with pytest.raises(SacEdgeError, match=f"checksum mismatch for {re.escape(POLICY_ONNX)}"):
        reopen_bundle(bundle, opened.manifest, opened.spec)
    changed = {**opened.manifest, "created": "later"}
    with pytest.raises(SacEdgeError, match="manifest changed since the run started"):
        reopen_bundle(bundle, changed, opened.spec)


@pytest.mark.parametrize("name", ["manifest.json", "manifest.sig"])
def test_a_symlinked_manifest_or_signature_is_refused(
    bundle: Path, tmp_path: Path, refused: Callable[..., str], name: str
) -> None:
    from sac_edge.common.signing import generate_keypair, load_private_key, sign_bundle

    private, public = generate_keypair(tmp_path / "k")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / public.name).write_bytes(public.read_bytes())
    sign_bundle(bundle, load_private_key(private))
    outside = tmp_path / name
    (bundle / name).rename(outside)
    (bundle / name).symlink_to(outside)
    argv = ["run", str(bundle), "--duration", "0.05", "--backend", "onnxruntime", "--trusted-keys", str(trusted)]
    assert "symlink" in refused(edge_cli.main, argv)


@pytest.mark.parametrize("version", ["8.5.3.1", "10.3.0", "11.4.0.106"])
def test_tensorrt_builds_the_verified_bytes_not_the_file(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """TensorRT's builder (at start and for a rebuild swap) parses the graph bytes open_bundle verified;
    a graph swapped on disk afterwards is neither built nor hashed into the plan's key, and a rebuild
    writes no graph file into the bundle for the builder to read back."""
    import hashlib
    import sys

    from fake_pycuda import fake_runner

    from sac_edge.common.manifest import read_manifest
    from sac_edge.edge_runtime.backends.base import BackendOptions

    runner, _, _ = fake_runner(version, monkeypatch)
    trt = sys.modules["tensorrt"]
    parsed: list[bytes] = []
    real_parser = trt.OnnxParser

    class RecordingParser:  # the fake's parser, with the bytes each parse was given kept
        def __init__(self, network: object, logger: object) -> None:
            self._parser = real_parser(network, logger)

        def parse(self, data: bytes) -> bool:
            parsed.append(bytes(data))
            return bool(self._parser.parse(data))

        def __getattr__(self, name: str) -> object:
            return getattr(self._parser, name)

    monkeypatch.setattr(trt, "OnnxParser", RecordingParser)
    opened = open_bundle(bundle)  # verified here
    graph = bundle / "policy.onnx"
    verified = graph.read_bytes()
    graph.write_bytes(_saturating(onnx.load(str(graph))).SerializeToString())  # swapped in between
    backend = runner.TensorRTBackend(opened, "fp32", BackendOptions(refit=True, engine_dir=tmp_path / "engines"))
    assert parsed == [verified]
    assert (
        backend.key.onnx_sha256
        == hashlib.sha256(verified).hexdigest()
        == read_manifest(bundle, verify=False)["files"]["policy.onnx"]["sha256"]
    )
    if not backend.key.refit:  # 11.3+: a swap rebuilds from the verified graph with the new weights
        weights = {i.name: numpy_helper.to_array(i) for i in onnx.load_from_string(verified).graph.initializer}
        backend.swap_weights(weights)
        assert (
            len(parsed) == 2
            and onnx.load_from_string(parsed[1]).graph.node == onnx.load_from_string(verified).graph.node
        )
        assert not list((tmp_path / "engines").rglob("*.onnx"))
    backend.close()
