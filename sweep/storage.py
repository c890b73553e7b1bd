"""Where trials persist their checkpoints: ``--storage`` (a path every node sees, or a pyarrow filesystem URI
such as ``s3://bucket/prefix?endpoint_override=host:port``) or, by default, the sweep dir itself.

As with Ray Tune's ``storage_path``, sweeps share a storage, each in its own folder (``--name``, by default
``--out``'s name; ``tune`` in the sweep dir): Tune writes each trial's newest checkpoint (a whole run dir)
under ``<storage>/<sweep>/<name>@<session>/``. This module finds the newest checkpoint of each trial by reading
its ``trainer_state.json`` (JSON, never a pickle), copies it back into ``DIR/trials/<name>``, prunes older
ones and clears the sweep's folder for ``--force``.
pyarrow comes with Ray; it is imported only here, once a sweep runs.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow.fs as pafs

from sac_edge.common.atomic import atomic_dir, atomic_write_json
from sac_edge.common.bounded import MAX_JSON_BYTES, open_regular
from sac_edge.common.errors import SacEdgeError
from sac_edge.train import checkpoint as ckpt

from . import remote
from .config import TUNE_DIR
from .grid import TRIALS, Trial
from .state import LOGS

SESSION_SEP = "@"
CHECKPOINT_PREFIX = "checkpoint_"
MANIFEST = "checkpoint_files.json"
#: The files of a run dir that make a checkpoint whole (tb/ keeps growing and is not checked).
CHECKED = (ckpt.CHECKPOINT, ckpt.TRAINER_STATE, ckpt.CONFIG, ckpt.METRICS)


class Storage(NamedTuple):
    """A storage location: the URI as given (for messages), its filesystem, the path inside it (the root that
    sweeps share, as Ray Tune's ``storage_path``) and the folder under it that is this sweep's alone."""

    uri: str
    fs: Any  # pyarrow.fs.FileSystem
    root: str
    experiment: str = TUNE_DIR

    @property
    def experiment_dir(self) -> str:
        return f"{self.root.rstrip('/')}/{self.experiment}"

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)


class Newest(NamedTuple):
    """A trial's newest persisted checkpoint: its step and its path inside the storage filesystem."""

    step: int
    path: str


def open_storage(uri: str, experiment: str = TUNE_DIR) -> Storage:
    """The filesystem ``uri`` names (a local path when it has no scheme; a remote one's waits bounded, see
    ``remote``), the sweep's own folder under it named ``experiment``; a bad URI is one line."""
    if "://" not in uri:
        return Storage(uri, pafs.LocalFileSystem(), str(Path(uri).resolve()), experiment)
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError, TypeError) as err:
        raise SacEdgeError(f"--storage {uri}: not a usable filesystem URI ({remote.first_line(err)})") from None
    return Storage(uri, remote.bounded(fs, uri), path.rstrip("/"), experiment)


def trial_dirname(name: str, session: str) -> str:
    """A trial's directory in the sweep's folder of the storage: one per session, so sessions never share a
    checkpoint."""
    return f"{name}{SESSION_SEP}{session}"


def _not_a_link(storage: Storage, path: str) -> None:
    """Refuse (one line) a symlink where a sweep keeps its own folders and files in a local storage: pyarrow's
    local filesystem follows links, and a checkpoint reached through one would be another folder's files."""
    if storage.local and os.path.islink(path):
        raise SacEdgeError(
            f"{path} is a symlink in the storage, which a sweep never follows; delete it (or move the folder it "
            "points to in its place)"
        )


def _dirs(storage: Storage, path: str) -> list[Any]:
    """The directories in ``path`` (itself not a link), each refused when it is a link."""
    _not_a_link(storage, path)
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
    found = [i for i in storage.fs.get_file_info(selector) if i.type == pafs.FileType.Directory]
    for info in found:
        _not_a_link(storage, info.path)
    return found


def write_manifest(run: Path) -> None:
    """Record the sizes of the run dir's files before Tune uploads it: a checkpoint whose upload was cut
    short (a node or the driver killed mid-copy) is then recognised and never resumed from."""
    sizes = {name: (run / name).stat().st_size for name in CHECKED if (run / name).is_file()}
    atomic_write_json(run / MANIFEST, {"sizes": sizes})


def _read_json(storage: Storage, path: str) -> dict[str, Any] | None:
    """The JSON object at ``path``, or None (missing, oversized, malformed). In a local storage only a regular
    file is read, never through a link: a FIFO planted there would block the read past Ctrl-C."""
    try:
        if storage.local:
            with os.fdopen(open_regular(Path(path), "a checkpoint's file", "delete it", follow=False), "rb") as fh:
                raw = fh.read(MAX_JSON_BYTES + 1)
        else:
            with storage.fs.open_input_stream(path) as fh:
                raw = fh.read(MAX_JSON_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_JSON_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _complete(storage: Storage, checkpoint: str) -> bool:
    """Whether every file the checkpoint's manifest lists is in storage at its recorded size."""
    manifest = _read_json(storage, f"{checkpoint}/{MANIFEST}")
    sizes = manifest.get("sizes") if manifest else None
    if not isinstance(sizes, dict) or not set(sizes) <= set(CHECKED) or ckpt.CHECKPOINT not in sizes:
        return False
    infos = storage.fs.get_file_info([f"{checkpoint}/{name}" for name in sizes])
    return all(i.type == pafs.FileType.File and i.size == sizes[i.base_name] for i in infos)


def _step(storage: Storage, checkpoint: str) -> int | None:
    """The step in a complete checkpoint's ``trainer_state.json``, or None (missing, cut short, not ours)."""
    state = _read_json(storage, f"{checkpoint}/{ckpt.TRAINER_STATE}")
    step = state.get("step") if state else None
    if not isinstance(step, int) or step < 0 or not _complete(storage, checkpoint):
        return None
    return step


def newest(storage: Storage, names: set[str]) -> dict[str, Newest]:
    """The newest complete checkpoint of each trial in ``names`` found in storage (all sessions)."""
    found: dict[str, Newest] = {}
    for trial_dir in _dirs(storage, storage.experiment_dir):
        name = trial_dir.base_name.rpartition(SESSION_SEP)[0]
        if name not in names:
            continue
        for entry in _dirs(storage, trial_dir.path):
            if not entry.base_name.startswith(CHECKPOINT_PREFIX):
                continue
            step = _step(storage, entry.path)
            if step is not None and (name not in found or step > found[name].step):
                found[name] = Newest(step, entry.path)
    return found


def newest_any(storage: Storage) -> bool:
    """Whether the sweep's folder in storage holds any trial's directory (an earlier sweep of that name)."""
    return any(not d.base_name.startswith(".") for d in _dirs(storage, storage.experiment_dir))


def checked_trials_dir(sweep_dir: Path) -> Path:
    """``DIR/trials``, refused when it or ``DIR/logs`` (or an entry in either) is a symlink: a sweep writes and
    deletes only inside its own directory (``--out`` itself may be a link the user made)."""
    for folder in (sweep_dir / TRIALS, sweep_dir / LOGS):
        inside = folder.iterdir() if folder.is_dir() and not folder.is_symlink() else ()
        for path in (folder, *inside):
            if path.is_symlink():
                raise SacEdgeError(
                    f"{path} is a symlink; a sweep dir holds its own trials and logs only: replace the link with "
                    "the directory or file it points to, or choose another --out"
                )
    return sweep_dir / TRIALS


#: The files of a checkpoint other than its safetensors, in all (JSON, metrics.csv, calibration states and
#: TensorBoard events: a few MiB even for a long run).
MAX_SIDE_BYTES = 1 << 30


def _files(storage: Storage, src: str) -> dict[str, int]:
    """The size of every file of the checkpoint dir ``src`` by its path in it; a link, a FIFO or a device
    there is refused in one line (a link would be copied as what it points to, a FIFO would block)."""
    _not_a_link(storage, src)
    if storage.local:
        entries = []
        for base, dirs, files in os.walk(src):
            entries += [os.path.join(base, e) for e in (*dirs, *files)]
        kinds = {path: os.lstat(path) for path in entries}
        odd = [p for p, st in kinds.items() if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))]
        sizes = {os.path.relpath(p, src): st.st_size for p, st in kinds.items() if stat.S_ISREG(st.st_mode)}
    else:
        infos = storage.fs.get_file_info(pafs.FileSelector(src, recursive=True))
        odd = [i.path for i in infos if i.type not in (pafs.FileType.File, pafs.FileType.Directory)]
        sizes = {i.path[len(src) :].lstrip("/"): i.size for i in infos if i.type == pafs.FileType.File}
    if odd:
        what = "a symlink" if os.path.islink(odd[0]) else "not a regular file"
        raise SacEdgeError(f"{odd[0]}: {what} in a checkpoint, which a sweep never copies; delete it")
    return sizes


def _declared_size(storage: Storage, path: str) -> int | None:
    """The size a safetensors file's header implies (8 bytes, the header, the data it places), or None."""
    try:
        if storage.local:
            fh: Any = os.fdopen(open_regular(Path(path), "a checkpoint", "delete it", follow=False), "rb")
        else:
            fh = storage.fs.open_input_stream(path)
        with fh:
            head = fh.read(8)
            size = int.from_bytes(head, "little") if len(head) == 8 else 0
            header = json.loads(fh.read(size)) if 0 < size <= MAX_JSON_BYTES else None
        if not isinstance(header, dict):
            return None
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None
    return 8 + size + max(ends, default=0)


def _check_copy(storage: Storage, src: str, dest: Path) -> None:
    """Refuse, before a byte is copied, a checkpoint that is not what sac-train writes or would fill the
    disk: a safetensors file longer or shorter than its header says (a sparse file of a few KiB on disk can
    claim terabytes), side files past MAX_SIDE_BYTES, or more bytes in all than ``dest``'s disk has free."""
    sizes = _files(storage, src)
    weights = sizes.get(ckpt.CHECKPOINT)
    if weights is not None and weights != _declared_size(storage, f"{src}/{ckpt.CHECKPOINT}"):
        raise SacEdgeError(
            f"{src}/{ckpt.CHECKPOINT}: its size ({weights} bytes) is not what its header describes, so sac-train "
            f"did not write it (a sparse or padded file); delete {src}"
        )
    side = sum(sizes.values()) - (weights or 0)
    if side > MAX_SIDE_BYTES:
        raise SacEdgeError(
            f"{src}: {side >> 20} MiB besides the weights, more than the {MAX_SIDE_BYTES >> 20} MiB a sac-train run "
            f"dir holds; delete {src}"
        )
    free = shutil.disk_usage(dest).free
    if sum(sizes.values()) > free:
        raise SacEdgeError(
            f"{src} holds {sum(sizes.values()) >> 20} MiB, more than the {free >> 20} MiB free at {dest}; free "
            "some space and run again"
        )


def _download(storage: Storage, src: str, dest: Path) -> None:
    """Copy one checkpoint dir into ``dest`` (an empty local dir), checked first (``_check_copy``)."""
    _check_copy(storage, src, dest)
    if storage.local:
        shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)
        return
    pafs.copy_files(src, str(dest), source_filesystem=storage.fs, destination_filesystem=pafs.LocalFileSystem())


def download(storage: Storage, src: str, dest: Path) -> None:
    """Copy the checkpoint at ``src`` into the fresh local directory ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _download(storage, src, dest)


def collect(storage: Storage, trials: list[Trial], sweep_dir: Path) -> dict[str, Newest]:
    """Copy each trial's newest checkpoint into ``DIR/trials/<name>`` when it is newer than the copy there
    (whole, atomically: a copy cut short leaves the older run dir), then prune older checkpoints.
    Returns the newest checkpoint of each trial that has one."""
    from .state import saved_step

    trials_dir = checked_trials_dir(sweep_dir)
    found = newest(storage, {t.run.name for t in trials})
    for trial in trials:
        best = found.get(trial.run.name)
        run = trials_dir / trial.run.name
        if best is None or best.step <= saved_step(run):
            continue
        with atomic_dir(run, replace=True) as staging:
            _download(storage, best.path, staging)
    prune(storage, found)
    return found


def prune(storage: Storage, keep: dict[str, Newest]) -> None:
    """Delete every trial dir in storage that does not hold the newest checkpoint of its trial."""
    kept = {n.path.rsplit("/", 1)[0] for n in keep.values()}
    for trial_dir in _dirs(storage, storage.experiment_dir):
        name = trial_dir.base_name.rpartition(SESSION_SEP)[0]
        if name in keep and trial_dir.path not in kept:
            storage.fs.delete_dir(trial_dir.path)


def clear(storage: Storage) -> None:
    """``--force``: delete everything a sweep wrote in its folder of the storage (other sweeps' stay)."""
    info = storage.fs.get_file_info(storage.experiment_dir)
    if info.type == pafs.FileType.Directory:
        storage.fs.delete_dir(storage.experiment_dir)
