"""Optional recording of the node's inputs, commands and events to an MCAP file with ROS 2 message schemas
(the ``mcap`` and ``mcap-ros2-support`` packages, pure Python): ``ros2 bag`` and Foxglove open it.

Each step writes the state message it acted on and the command it published, so a recording replays
through ``Runtime`` to the same commands (``tests/ros2``). The schemas are the messages' public definitions,
kept here so that a device without the ``.msg`` files still records."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.summary import strict_json

_SEP = "\n" + "=" * 80 + "\n"
_TIME = "MSG: builtin_interfaces/Time\nint32 sec\nuint32 nanosec"
_HEADER = "MSG: std_msgs/Header\nbuiltin_interfaces/Time stamp\nstring frame_id"
SCHEMAS = {
    "sensor_msgs/msg/JointState": _SEP.join(
        [
            "std_msgs/Header header\nstring[] name\nfloat64[] position\nfloat64[] velocity\nfloat64[] effort",
            _HEADER,
            _TIME,
        ]
    ),
    "std_msgs/msg/Float64MultiArray": _SEP.join(
        [
            "MultiArrayLayout layout\nfloat64[] data",
            "MSG: std_msgs/MultiArrayLayout\nMultiArrayDimension[] dim\nuint32 data_offset",
            "MSG: std_msgs/MultiArrayDimension\nstring label\nuint32 size\nuint32 stride",
        ]
    ),
    "std_msgs/msg/String": "string data",
}
EVENTS_TOPIC = "/sac_edge/events"
#: The MCAP chunk size: at 200 Hz a step's state and command are about 400 bytes, so a chunk is about 0.4 s.
CHUNK_BYTES = 32 * 1024
#: Written chunks reach the file at least this often (the file object's buffer holds the rest).
FLUSH_NS = 250_000_000


def offered_qos(reliability: str, depth: int, durability: str) -> str:
    """rosbag2's YAML of one offered QoS profile (keep last ``depth``; rmw's enum values; infinite durations)."""
    forever = "\n    sec: 9223372036\n    nsec: 854775807"
    return (
        f"- history: 1\n  depth: {depth}\n  reliability: {1 if reliability == 'reliable' else 2}\n"
        f"  durability: {1 if durability == 'transient_local' else 2}\n  deadline:{forever}\n"
        f"  lifespan:{forever}\n  liveliness: 1\n  liveliness_lease_duration:{forever}\n"
        "  avoid_ros_namespace_conventions: false"
    )


class Recorder:
    """An open MCAP file: ``write`` and ``event`` append (log time: ``clock_ns()``, the node's clock), ``close``
    finishes it."""

    def __init__(
        self,
        path: str,
        overwrite: bool,
        clock_ns: Callable[[], int],
        chunk_bytes: int = CHUNK_BYTES,
        flush_ns: int = FLUSH_NS,
    ) -> None:
        self._clock_ns = clock_ns
        target = Path(path)
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise SacEdgeError(f"record {path}: a symlink or not a regular file; choose another path")
        if target.exists() and not overwrite:
            raise SacEdgeError(f"record {path} already exists; choose another path or set record_overwrite")
        if not target.parent.is_dir():
            raise SacEdgeError(f"record {path}: its directory does not exist")
        try:
            from mcap_ros2.writer import Writer
        except ImportError:
            raise SacEdgeError(
                "record needs the mcap and mcap-ros2-support packages (pip install mcap-ros2-support)"
            ) from None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        self._path = target
        self._file = os.fdopen(os.open(target, flags, 0o644), "wb")
        self._flushed_ns = 0
        # small chunks, each written whole as it fills: a crash (SIGKILL) loses at most the open chunk,
        # about CHUNK_BYTES of messages (BENCHMARKS.md "Edge: ROS 2" has the cost per step)
        self._writer = Writer(self._file, chunk_size=chunk_bytes)
        self._flush_ns = flush_ns
        self._schemas = {name: self._writer.register_msgdef(name, text) for name, text in SCHEMAS.items()}
        self.messages = 0

    def declare(self, topic: str, datatype: str, qos: tuple[str, int, str]) -> None:
        """The channel of ``topic`` with the QoS its publisher offers, as rosbag2 writes it in the channel's
        ``offered_qos_profiles`` metadata (``qos``: reliability, depth, durability as the parameters name them)."""
        channels = getattr(self._writer, "_channel_ids", None)
        inner = getattr(self._writer, "_writer", None)
        if channels is None or inner is None or topic in channels:  # another mcap-ros2 release: no metadata
            return
        metadata = {"offered_qos_profiles": offered_qos(*qos)}
        channels[topic] = inner.register_channel(
            topic=topic, message_encoding="cdr", schema_id=self._schemas[datatype].id, metadata=metadata
        )

    def write(self, topic: str, datatype: str, message: Any) -> None:
        t_ns = self._clock_ns()
        self._writer.write_message(topic, self._schemas[datatype], message, log_time=t_ns, publish_time=t_ns)
        self.messages += 1
        if t_ns - self._flushed_ns > self._flush_ns:  # the chunks written so far reach the file, whatever happens next
            self._file.flush()
            self._flushed_ns = t_ns

    def event(self, record: dict[str, Any]) -> None:
        self.write(EVENTS_TOPIC, "std_msgs/msg/String", {"data": strict_json(record)})

    def close(self) -> None:
        try:
            self._writer.finish()
        finally:
            self._file.close()

    def abandon(self) -> None:
        """Close without finishing and remove the file (a configure that failed after opening it)."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self._path)
