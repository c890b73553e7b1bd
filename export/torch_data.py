"""A ``torch.save`` file of plain tensors (a state dict) read as data: its ``data.pkl`` by the pickle
opcode reader (``pickle_data``), each tensor rebuilt from its storage record's raw bytes, dtype, size,
stride and offset after checking them. Nothing in the file is unpickled, imported or called; any global
but the few a state dict names (``OrderedDict``, ``_rebuild_tensor_v2``, the typed storages) refuses it.
"""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any, NamedTuple

import torch

from .pickle_data import DICT, PickleDataError, Ref, read_pickle

_STORAGES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}
_ITEM_BYTES = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in _STORAGES.values()}
_GLOBALS = {
    ("collections", "OrderedDict"): DICT,
    ("torch._utils", "_rebuild_tensor_v2"): "tensor",
    **{("torch", name): name for name in _STORAGES},
}


class _Storage(NamedTuple):
    dtype: torch.dtype
    key: str
    numel: int


def _storage(pid: Any) -> _Storage:
    """A BINPERSID reference: ``('storage', <typed storage>, key, location, numel)``."""
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        raise PickleDataError("a persistent reference that is not a storage")
    kind, key, numel = pid[1], pid[2], pid[4]
    if not (isinstance(kind, Ref) and kind.kind in _STORAGES and kind.args is None):
        raise PickleDataError("a storage of an unknown type")
    if not (isinstance(key, str) and key.isdigit() and type(numel) is int and numel >= 0):
        raise PickleDataError("a storage without a key and a size")
    return _Storage(_STORAGES[kind.kind], key, numel)


def _ints(value: Any) -> tuple[int, ...]:
    if not (isinstance(value, tuple) and len(value) <= 8 and all(type(v) is int and v >= 0 for v in value)):
        raise PickleDataError("a tensor size or stride that is not a tuple of sizes")
    return value


class _View(NamedTuple):
    """A tensor a ``_rebuild_tensor_v2`` record describes: a view of one storage, not yet built."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """What building it allocates (``as_strided(...).clone()`` copies every element, even of a stride-0
        view)."""
        return math.prod(self.size) * _ITEM_BYTES[self.storage.dtype]


def _view(value: Any) -> _View:
    """The view a ``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)`` record
    describes, its extent checked against the storage's declared size."""
    args = value.args if isinstance(value, Ref) and value.kind == "tensor" and not value.built else None
    if not (isinstance(args, tuple) and len(args) in (6, 7) and isinstance(args[0], _Storage)):
        raise PickleDataError("a value that is not a plain tensor")
    storage, offset, size, stride = args[0], args[1], _ints(args[2]), _ints(args[3])
    if type(offset) is not int or offset < 0 or len(size) != len(stride) or args[5] != {}:
        raise PickleDataError("a tensor with a bad offset, stride or hooks")
    if 0 not in size and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.numel:
        raise PickleDataError("a tensor reaching past its storage")
    return _View(storage, offset, size, stride)


def _check_total(views: dict[str, _View], storages: dict[str, _Storage]) -> None:
    """Refuse, before any is built, views that together take more memory than the storages the file holds:
    a state dict's tensors never overlap, but a stride-0 view of one value or one tensor under thousands of
    names would make a few KiB of file allocate gigabytes."""
    held = sum(s.numel * _ITEM_BYTES[s.dtype] for s in storages.values())
    total = sum(view.nbytes for view in views.values())
    if total > held:
        raise PickleDataError(
            f"its {len(views)} tensors take {total} bytes, more than the {held} bytes of data it holds "
            "(repeated or overlapping views, not a state dict)"
        )


def _build(view: _View, blobs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tensor of ``view``, copied out of its storage's bytes."""
    flat = blobs[view.storage.key]
    return torch.as_strided(flat, view.size, view.stride, view.offset).clone()


def read_state_dict(archive: zipfile.ZipFile) -> dict[str, torch.Tensor]:
    """The ``{name: tensor}`` of a torch.save zip (records already size-checked by the caller)."""
    names = archive.namelist()
    pkl = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(pkl) != 1:
        raise PickleDataError("not one data.pkl")
    root = pkl[0][: -len("data.pkl")]
    if root + "byteorder" in names and archive.read(root + "byteorder").strip() != b"little":
        raise PickleDataError("a big-endian file")
    storages: dict[str, _Storage] = {}

    def persistent(pid: Any) -> _Storage:
        found = _storage(pid)
        if storages.setdefault(found.key, found) != found:
            raise PickleDataError(f"storage {found.key[:12]} declared twice differently")
        return found

    top = read_pickle(archive.read(pkl[0]), _GLOBALS, persistent)
    if not isinstance(top, dict) or not all(isinstance(k, str) for k in top):
        raise PickleDataError("not a dict of named tensors")
    views = {name: _view(value) for name, value in top.items()}
    _check_total(views, storages)
    blobs = {}
    for key, found in storages.items():
        member = f"{root}data/{key}"
        if member not in names:
            raise PickleDataError(f"storage {key[:12]} is missing")
        raw = archive.read(member)
        size = found.numel * _ITEM_BYTES[found.dtype]
        if len(raw) != size:
            raise PickleDataError(f"storage {key[:12]} holds {len(raw)} bytes for {size}")
        blobs[key] = torch.frombuffer(bytearray(raw), dtype=found.dtype) if size else torch.empty(0, dtype=found.dtype)
    return {name: _build(view, blobs) for name, view in views.items()}


def load_state_dict(raw: bytes) -> dict[str, torch.Tensor]:
    """``read_state_dict`` on the bytes of a torch.save file."""
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        return read_state_dict(archive)
