"""Opening a deployment bundle: ``open_bundle`` checks the manifest (schema, names, signature and release
with trusted keys), every listed file's sha256 and every graph, and returns a ``Bundle`` holding the bytes
it verified, which is all any backend, plan key or learner ever loads (a file swapped on disk after the
check is never read). The names it reads are ``bundle_format.py``'s; the manifest's rules ``manifest.py``'s.

It lives in ``common`` because every stage after export reads bundles: the runtime's backends, doctor,
drill and bench, and the fine-tuner's learner process. onnx is imported only when a graph is checked.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .bundle_format import FP32, GRAPH_KINDS, MANIFEST, ONNX_CPU_KIND, ONNX_KIND
from .errors import SacEdgeError
from .graph_ops import check_graph_ops
from .manifest import manifest_bytes, read_manifest, verify_files
from .obs_history import ObsContract
from .releases import check_release
from .signing import require_trusted
from .spec import PolicySpec


class Bundle(NamedTuple):
    """A verified bundle: its directory, manifest, policy spec and the bytes of every listed file whose
    sha256 was checked (what backends load: a file swapped on disk after the check is never read)."""

    path: Path
    manifest: dict[str, Any]
    spec: PolicySpec
    verified: Mapping[str, bytes] = types.MappingProxyType({})

    def read(self, path: Path) -> bytes:
        """The verified bytes of the bundle file at ``path`` (one of ``files``); a file that was not
        verified is one SacEdgeError line, never read from disk."""
        try:
            data = self.verified.get(path.relative_to(self.path).as_posix())
        except ValueError:
            data = None
        if data is None:
            raise SacEdgeError(
                f"{path}: not a bundle file whose checksum was verified; open the bundle with open_bundle"
            )
        return data

    @property
    def observation(self) -> ObsContract | None:
        """The policy input's contract (``--last-action``, ``--obs-history``), None for the frame alone."""
        data = self.manifest.get("observation")
        if data is None:
            return None
        contract = ObsContract.from_dict(data, str(self.path / MANIFEST))
        if contract.obs_dim != self.spec.obs_dim or contract.act_dim != self.spec.act_dim:
            raise SacEdgeError(f"{self.path}: the manifest's observation contract does not fit its spec; re-export")
        return contract

    @property
    def frame_dim(self) -> int:
        """The width of the env's frame a caller passes (the policy input's, without a contract)."""
        contract = self.observation
        return self.spec.obs_dim if contract is None else contract.frame_dim

    @property
    def frame_spec(self) -> PolicySpec:
        """The spec as a caller's env sees it: ``obs_dim`` the frame's width."""
        return dataclasses.replace(self.spec, obs_dim=self.frame_dim)

    def files(self, kind: str, precision: str | None = None) -> list[str]:
        """Names of the manifest files of ``kind`` (and ``precision`` when given), sorted."""
        out = []
        for name, entry in sorted(self.manifest.get("files", {}).items()):
            if entry.get("kind") != kind:
                continue
            if precision is not None and (entry.get("precision") or FP32) != precision:
                continue
            out.append(name)
        return out

    def onnx(self, precision: str) -> Path | None:
        """The ONNX graph stored for ``precision``, if the bundle has one."""
        names = self.files(ONNX_KIND, precision)
        return self.path / names[0] if names else None

    def cpu_onnx(self, precision: str) -> Path | None:
        """The graph onnxruntime's CPU provider should run for ``precision``: the integer-storage INT8 graph
        where the bundle has one (``calibration/integer.py``), else ``onnx(precision)``."""
        names = self.files(ONNX_CPU_KIND, precision)
        return self.path / names[0] if names else self.onnx(precision)


def open_bundle(path: str | Path, trusted_keys: str | Path | None = None, *, allow_downgrade: bool = False) -> Bundle:
    """Read a bundle, verifying format_version, the manifest's schema and names, and every file's sha256
    (one-line error on a mismatch), keeping the verified bytes. With ``trusted_keys`` (a directory of
    public keys) the manifest must first carry a signature by one of them (``common.signing``), and its
    release must not be older than the newest accepted from that key unless ``allow_downgrade``
    (``common.releases``). The manifest is read once: the bytes whose signature is checked are the bytes
    parsed. A graph with external data is refused (its weights would come from a file nothing vouches for)."""
    root = Path(path)
    data = manifest_bytes(root)
    state = require_trusted(root, trusted_keys, data) if trusted_keys is not None else None
    manifest = read_manifest(root, verify=False, data=data)
    verified = verify_files(root, manifest)
    spec = PolicySpec.from_dict(manifest.get("spec", {}), source=str(root / MANIFEST))
    onnx_section = manifest.get("onnx")
    listed = onnx_section.get("ops") if isinstance(onnx_section, dict) else None
    for name in sorted(verified):
        entry = manifest["files"][name]
        if entry.get("kind") in GRAPH_KINDS:
            # The op allow-list and the manifest's op list, on the verified bytes, before any runtime opens
            # the graph: a graph that would never return is refused here.
            model = check_graph(root / name, verified[name], spec)
            check_graph_ops(model, str(root / name), entry.get("precision") or FP32, listed)
    if state is not None and state.key_id is not None:
        check_release(root, manifest, state.key_id, allow_downgrade=allow_downgrade)
    return Bundle(root, manifest, spec, types.MappingProxyType(verified))


def reopen_bundle(path: str | Path, manifest: Mapping[str, Any], spec: PolicySpec) -> Bundle:
    """The bundle ``open_bundle`` opened, read again in another process (the fine-tuner's learner): its
    manifest must still be ``manifest``, the one that was opened (and, with trusted keys, whose signature was
    checked), and its files are verified again, so the bytes served there are verified there too."""
    root = Path(path)
    read = read_manifest(root, verify=False)
    if read != manifest:
        raise SacEdgeError(f"{root}: the bundle's manifest changed since the run started; start the run again")
    return Bundle(root, read, spec, types.MappingProxyType(verify_files(root, read)))


def check_graph(path: Path, data: bytes, spec: PolicySpec) -> Any:
    """The ONNX graph ``data``, parsed; one SacEdgeError line when it keeps any tensor outside itself
    (external data: onnxruntime would read it from a file beside the graph, which the manifest neither lists
    nor hashes), or when its input and output widths are not the spec's (buffers are sized from the spec)."""
    import onnx

    try:
        model = onnx.load_from_string(data)
    except Exception as err:  # protobuf's DecodeError and friends
        raise SacEdgeError(f"{path}: not an ONNX graph ({str(err)[:120]}); re-export the bundle") from None
    for what, values, want in (
        ("input", model.graph.input, spec.obs_dim),
        ("output", model.graph.output, spec.act_dim),
    ):
        dims = [list(v.type.tensor_type.shape.dim) for v in values[:1]]
        width = dims[0][-1].dim_value if dims and dims[0] else None
        if width != want:
            raise SacEdgeError(
                f"{path}: the graph's {what} width is {width or 'not fixed'}, the manifest says {want}; "
                "re-export the bundle"
            )
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.external_data:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "?")
            raise SacEdgeError(
                f"{path}: tensor {tensor.name[:60]!r} is external data ({location[:60]!r}), which the manifest "
                "does not vouch for; re-export the bundle with sac-export (it keeps every weight in the graph)"
            )
    return model


def _tensors(graph: Any) -> Any:
    """Every TensorProto of ``graph``: initializers, sparse initializers and node attributes, subgraphs too."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)
