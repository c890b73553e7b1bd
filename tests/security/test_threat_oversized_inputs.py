"""Finding 5: sizes are checked before anything is read into memory.

An SB3 ``.zip`` whose member inflates to gigabytes (a zip bomb), and JSON files far larger than any
sac-edge writes, are one-line errors (exit 2) instead of an out-of-memory crash.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

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
    data = bytearray(path.read_bytes())
    name = member.encode()
    at = data.find(b"PK\x01\x02")  # first central directory header
    while at != -1:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + name_len] == name:
            struct.pack_into("<I", data, at + 24, size)
            path.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(member)


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
