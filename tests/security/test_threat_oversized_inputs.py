"""Sizes are checked before anything is read into memory.

An SB3 ``.zip`` whose member inflates to gigabytes (a zip bomb), a ``policy.pth`` whose tensor record is
deflated, a VecNormalize pickle naming a huge array, a manifest naming a huge or wrong observation width,
and JSON files far larger than any sac-edge writes, are one-line errors (exit 2) instead of an
out-of-memory crash.
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile_zips import SIZE, patch_central

from sac_edge.common import bounded
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.jsonfile import read_json
from sac_edge.export import cli as export_cli
from sac_edge.export import sb3


def _zip(path: Path, policy: bytes) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", json.dumps({}))
        archive.writestr("policy.pth", policy)
    return path


def _declare_size(path: Path, member: str, size: int) -> None:
    """Rewrite ``member``'s uncompressed size in the central directory (the size zipfile trusts)."""
    path.write_bytes(patch_central(path.read_bytes(), member, SIZE, size))


def test_zip_member_declared_to_inflate_to_gigabytes_is_refused_unread(
    tmp_path: Path, refused: Callable[..., str]
) -> None:
    bomb = _zip(tmp_path / "bomb.zip", b"\0" * 1024)
    _declare_size(bomb, "policy.pth", 0xFFFF0000)  # ~4 GiB
    err = refused(export_cli.main, [str(bomb), "--env", "Pendulum-v1", "--out", str(tmp_path / "b")], prog="sac-export")
    assert "policy.pth inflates to" in err and "limit" in err


def test_zip_bomb_inflating_past_the_cap_is_refused(
    tmp_path: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sb3, "MAX_MEMBER_BYTES", 1 << 20)
    bomb = _zip(tmp_path / "bomb.zip", b"\0" * (8 << 20))  # 8 MiB of zeros, ~8 KiB compressed
    assert bomb.stat().st_size < 64 << 10
    err = refused(export_cli.main, [str(bomb), "--env", "Pendulum-v1", "--out", str(tmp_path / "b")], prog="sac-export")
    assert "inflates to 8.0 MiB" in err


def test_capped_read_never_reads_past_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(bounded.MAX_JSON_BYTES + 1)
    with pytest.raises(SacEdgeError, match=r"larger than 16\.0 MiB"):
        read_json(path, "record", "delete it")


class _HugeArray:
    """Pickles as ``numpy.ndarray((N,), float64)``: globals the VecNormalize reader allows, 8 TB to allocate."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        import numpy as np

        return (np.ndarray, ((10**12,), np.dtype("f8")))


def test_vecnormalize_array_sizes_are_checked_before_allocation(tmp_path: Path) -> None:
    rms_module = pytest.importorskip("stable_baselines3.common.running_mean_std")
    from sac_edge.export.vecnormalize import load_vecnormalize

    rms = rms_module.RunningMeanStd(shape=(3,))
    rms.mean = _HugeArray()
    pkl = tmp_path / "vecnormalize.pkl"
    pkl.write_bytes(pickle.dumps({"obs_rms": rms}))
    assert pkl.stat().st_size < 2048
    with pytest.raises(SacEdgeError, match="larger than 64 MiB"):
        load_vecnormalize(pkl)


def test_a_deflated_tensor_record_in_policy_pth_is_refused(tmp_path: Path, refused: Callable[..., str]) -> None:
    import torch

    saved = io.BytesIO()
    torch.save({"actor.mu.weight": torch.zeros(16 << 20)}, saved)  # 64 MiB of zeros
    deflated = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(saved.getvalue())) as src, zipfile.ZipFile(
        deflated, "w", zipfile.ZIP_DEFLATED
    ) as out:
        for info in src.infolist():
            out.writestr(info.filename, src.read(info))
    assert len(deflated.getvalue()) < 1 << 20
    bomb = _zip(tmp_path / "bomb.zip", deflated.getvalue())
    err = refused(export_cli.main, [str(bomb), "--env", "Pendulum-v1", "--out", str(tmp_path / "b")], prog="sac-export")
    assert "is compressed" in err and "policy.pth" in err


@pytest.mark.parametrize(("obs_dim", "says"), [(10**9, "from 1 to 65536"), (4, "input width is 3")])
def test_manifest_dimensions_are_bounded_by_the_graph(
    bundle: Path, refused: Callable[..., str], obs_dim: int, says: str
) -> None:
    from sac_edge.edge_runtime import cli as edge_cli

    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["spec"]["obs_dim"] = obs_dim
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    err = refused(edge_cli.main, ["bench", str(bundle), "--backends", "onnxruntime", "--calls", "5", "--warmup", "1"])
    assert says in err
