"""Hostile Stable-Baselines3 zips made from a clean one (the ``sb3_zip`` fixture): members replaced, the
policy's state dict changed and saved again, and zip headers patched where ``zipfile`` would not write them
(a damaged file, not one a library makes)."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

CENTRAL = b"PK\x01\x02"
#: Fields of a central directory header (APPNOTE 4.3.12), by offset: (struct format, offset).
VERSION_NEEDED = ("<B", 6)
FLAGS = ("<H", 8)
METHOD = ("<H", 10)
SIZE = ("<I", 24)


def patch_central(data: bytes, member: str, field: tuple[str, int], value: int) -> bytes:
    """``data`` (a zip) with ``field`` of ``member``'s central directory header set to ``value`` (the header
    zipfile trusts)."""
    out, name = bytearray(data), member.encode()
    at = out.find(CENTRAL)
    while at != -1:
        name_len = struct.unpack_from("<H", out, at + 28)[0]
        if out[at + 46 : at + 46 + name_len] == name:
            struct.pack_into(field[0], out, at + field[1], value)
            return bytes(out)
        at = out.find(CENTRAL, at + 4)
    raise AssertionError(member)


def members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def zipped(files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``files`` (SB3 deflates its members; torch.save stores its records)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, raw in files.items():
            archive.writestr(name, raw)
    return buffer.getvalue()


def rezip(src: Path, dst: Path, **replaced: bytes | None) -> Path:
    """A copy of the zip ``src`` with members replaced (``policy_pth=...`` names ``policy.pth``; None
    removes it)."""
    files = members(src)
    for key, raw in replaced.items():
        name = key.replace("_pth", ".pth")
        if raw is None:
            files.pop(name)
        else:
            files[name] = raw
    dst.write_bytes(zipped(files))
    return dst


def state_dict(src: Path, member: str = "policy.pth") -> dict[str, torch.Tensor]:
    """The tensors of ``member`` (``torch.load``: the test wrote this file)."""
    return dict(torch.load(io.BytesIO(members(src)[member]), weights_only=True))


def saved(tensors: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def with_state(src: Path, dst: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    """A copy of ``src`` whose policy.pth is its state dict after ``change``, saved by torch.save."""
    tensors = state_dict(src)
    change(tensors)
    return rezip(src, dst, policy_pth=saved(tensors))


def torch_records(raw: bytes) -> dict[str, bytes]:
    """The records of a torch.save file."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}
