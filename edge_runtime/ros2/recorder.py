"""Optional recording of the node's inputs, commands and events to an MCAP file with ROS 2 message schemas
(the ``mcap`` and ``mcap-ros2-support`` packages, pure Python): ``ros2 bag`` and Foxglove open it.

Each step writes the state message it acted on and the command it published, so a recording replays
through ``Runtime`` to the same commands (``tests/ros2``). The schemas are the messages' public definitions,
kept here so that a device without the ``.msg`` files still records."""

from __future__ import annotations

import os
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


class Recorder:
    """An open MCAP file: ``state``, ``command`` and ``event`` append, ``close`` finishes it."""

    def __init__(self, path: str, overwrite: bool) -> None:
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
        self._file = os.fdopen(os.open(target, flags, 0o644), "wb")
        self._writer = Writer(self._file)
        self._schemas = {name: self._writer.register_msgdef(name, text) for name, text in SCHEMAS.items()}
        self.messages = 0

    def write(self, topic: str, datatype: str, message: Any, t_ns: int) -> None:
        self._writer.write_message(topic, self._schemas[datatype], message, log_time=t_ns, publish_time=t_ns)
        self.messages += 1

    def event(self, record: dict[str, Any], t_ns: int) -> None:
        self.write(EVENTS_TOPIC, "std_msgs/msg/String", {"data": strict_json(record)}, t_ns)

    def close(self) -> None:
        self._writer.finish()
        self._file.close()
