"""Where trials persist their checkpoints: ``--storage`` (a path every node sees, or a pyarrow filesystem URI
such as ``s3://bucket/prefix?endpoint_override=host:port``) or, by default, the sweep dir itself.

Tune writes each trial's newest checkpoint (a whole run dir) under ``<storage>/tune/<name>@<session>/``.
This module finds the newest checkpoint of each trial by reading its ``trainer_state.json`` (JSON, never a
pickle), copies it back into ``DIR/trials/<name>``, prunes older ones and clears the prefix for ``--force``.
pyarrow comes with Ray; it is imported only here, once a sweep runs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow.fs as pafs

from sac_edge.common.atomic import atomic_dir, atomic_write_json
from sac_edge.common.bounded import MAX_JSON_BYTES
from sac_edge.common.errors import SacEdgeError
from sac_edge.train import checkpoint as ckpt

from .grid import TRIALS, Trial

TUNE_DIR = "tune"
SESSION_SEP = "@"
CHECKPOINT_PREFIX = "checkpoint_"
MANIFEST = "checkpoint_files.json"
#: The files of a run dir that make a checkpoint whole (tb/ keeps growing and is not checked).
CHECKED = (ckpt.CHECKPOINT, ckpt.TRAINER_STATE, ckpt.CONFIG, ckpt.METRICS)


class Storage(NamedTuple):
    """A storage location: the URI as given (for messages), its filesystem and the path inside it."""

    uri: str
    fs: Any  # pyarrow.fs.FileSystem
    root: str

    @property
    def tune_dir(self) -> str:
        return f"{self.root.rstrip('/')}/{TUNE_DIR}"

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)


class Newest(NamedTuple):
    """A trial's newest persisted checkpoint: its step and its path inside the storage filesystem."""

    step: int
    path: str


def open_storage(uri: str) -> Storage:
    """The filesystem ``uri`` names (a local path when it has no scheme); a bad URI is one line."""
    if "://" not in uri:
        return Storage(uri, pafs.LocalFileSystem(), str(Path(uri).resolve()))
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (ValueError, OSError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SacEdgeError(f"--storage {uri}: not a usable filesystem URI ({first})") from None
    return Storage(uri, fs, path.rstrip("/"))


def trial_dirname(name: str, session: str) -> str:
    """A trial's directory under ``<storage>/tune``: one per session, so sessions never share a checkpoint."""
    return f"{name}{SESSION_SEP}{session}"


def _dirs(storage: Storage, path: str) -> list[Any]:
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
    return [i for i in storage.fs.get_file_info(selector) if i.type == pafs.FileType.Directory]


def write_manifest(run: Path) -> None:
    """Record the sizes of the run dir's files before Tune uploads it: a checkpoint whose upload was cut
    short (a node or the driver killed mid-copy) is then recognised and never resumed from."""
    sizes = {name: (run / name).stat().st_size for name in CHECKED if (run / name).is_file()}
    atomic_write_json(run / MANIFEST, {"sizes": sizes})


def _read_json(storage: Storage, path: str) -> dict[str, Any] | None:
    try:
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
    for trial_dir in _dirs(storage, storage.tune_dir):
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
    """Whether storage holds any trial's directory (another sweep's checkpoints)."""
    return any(not d.base_name.startswith(".") for d in _dirs(storage, storage.tune_dir))


def checked_trials_dir(sweep_dir: Path) -> Path:
    """``DIR/trials``, refused when it (or a trial dir in it) is a symlink: a sweep writes and deletes only
    inside its own directory (``--out`` itself may be a link the user made)."""
    trials = sweep_dir / TRIALS
    for path in (trials, *(trials.iterdir() if trials.is_dir() and not trials.is_symlink() else ())):
        if path.is_symlink():
            raise SacEdgeError(
                f"{path} is a symlink; a sweep dir holds its own trials only: replace the link with the directory "
                "it points to or choose another --out"
            )
    return trials


def _download(storage: Storage, src: str, dest: Path) -> None:
    """Copy one checkpoint dir into ``dest`` (an empty local dir); in local storage, never through a link."""
    if storage.local:
        for base, dirs, files in os.walk(src):
            for entry in (*dirs, *files):
                if os.path.islink(os.path.join(base, entry)):
                    raise SacEdgeError(f"{os.path.join(base, entry)}: a symlink in a checkpoint; delete it")
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
    for trial_dir in _dirs(storage, storage.tune_dir):
        name = trial_dir.base_name.rpartition(SESSION_SEP)[0]
        if name in keep and trial_dir.path not in kept:
            storage.fs.delete_dir(trial_dir.path)


def clear(storage: Storage) -> None:
    """``--force``: delete everything a sweep wrote under ``<storage>/tune``."""
    info = storage.fs.get_file_info(storage.tune_dir)
    if info.type == pafs.FileType.Directory:
        storage.fs.delete_dir(storage.tune_dir)
