"""Reading a robot's log: an MCAP file, or a rosbag2 directory (``ros2 bag record -s mcap``: ``metadata.yaml``
beside one or more ``.mcap`` files), with ROS 2 messages decoded from the definitions the file carries (the
``mcap`` and ``mcap-ros2-support`` packages; no ROS install). Symlinks, FIFOs and other non-regular files are
refused before anything is opened."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sac_edge.common.errors import SacEdgeError

MCAP_MAGIC = b"\x89MCAP0\r\n"
INSTALL = "pip install 'sac-edge[replay]' (the mcap and mcap-ros2-support packages)"


def recording_files(path: str | Path) -> list[Path]:
    """The MCAP files of ``path`` in recording order: the file itself, or a rosbag2 directory's ``.mcap``
    files by their split number. One line naming the problem otherwise."""
    p = Path(path)
    if p.is_symlink():
        raise SacEdgeError(f"{path}: a symlink; give the recording itself")
    if p.is_dir():
        files = [c for c in p.iterdir() if c.suffix == ".mcap"]
        if not files:
            has_db3 = any(c.suffix == ".db3" for c in p.iterdir())
            why = " (a sqlite3 bag: record with ros2 bag record -s mcap, or convert it)" if has_db3 else ""
            raise SacEdgeError(f"{path}: a directory with no .mcap file{why}")
        files.sort(key=lambda c: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", c.name)])
    elif p.exists():
        files = [p]
    else:
        raise SacEdgeError(f"{path}: no such file or directory")
    for f in files:
        mode = os.lstat(f).st_mode
        if not stat.S_ISREG(mode):
            raise SacEdgeError(f"{f}: not a regular file (a symlink, FIFO or device); give the recording itself")
        with open(f, "rb") as handle:
            if handle.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
                raise SacEdgeError(f"{f}: not an MCAP file (record with ros2 bag record -s mcap)")
    return files


def _reader_parts() -> tuple[Any, Any]:
    try:
        from mcap.reader import make_reader
        from mcap_ros2.decoder import DecoderFactory
    except ImportError:
        raise SacEdgeError(f"reading a recording needs {INSTALL}") from None
    return make_reader, DecoderFactory


def topic_types(files: Sequence[Path]) -> dict[str, str]:
    """Every topic of the recording with its message type (``sensor_msgs/msg/JointState``)."""
    make_reader, _ = _reader_parts()
    out: dict[str, str] = {}
    for f in files:
        try:
            with open(f, "rb") as handle:
                reader = make_reader(handle)
                summary = reader.get_summary()
                if summary is not None:
                    for channel in summary.channels.values():
                        schema = summary.schemas.get(channel.schema_id)
                        out[channel.topic] = schema.name if schema is not None else ""
                else:  # an unfinished file (the recorder was killed): its channels as the messages name them
                    for schema, channel, _ in reader.iter_messages():
                        out[channel.topic] = schema.name if schema is not None else ""
        except SacEdgeError:
            raise
        except Exception as err:
            raise SacEdgeError(f"{f}: cannot be read as MCAP ({_first_line(err)})") from None
    return out


def messages(files: Sequence[Path], topics: Sequence[str]) -> Iterator[tuple[str, int, Any]]:
    """(topic, log time in ns, decoded message) of ``topics``, in log-time order within each file."""
    make_reader, decoders = _reader_parts()
    for f in files:
        try:
            with open(f, "rb") as handle:
                reader = make_reader(handle, decoder_factories=[decoders()])
                for _, channel, message, decoded in reader.iter_decoded_messages(
                    topics=list(topics), log_time_order=True
                ):
                    yield channel.topic, int(message.log_time), decoded
        except SacEdgeError:
            raise
        except Exception as err:
            raise SacEdgeError(f"{f}: a message cannot be decoded ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
