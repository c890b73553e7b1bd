"""Replays a node's MCAP recording through the in-process ``Runtime`` (the ROS venv, no ROS needed): every
recorded state -> the reference action, compared bit for bit with the command the node published for it.
``replay.py BUNDLE RECORDING KEY=VALUE...`` (the run options the node had) prints one JSON line (also each
``ramp_origin`` event with the command sent next)."""

from __future__ import annotations

import json
import sys

import numpy as np
from mcap_ros2.reader import read_ros2_messages

from sac_edge.common.bundle import open_bundle
from sac_edge.common.config import parse_value
from sac_edge.common.io_layout import bundle_layout
from sac_edge.edge_runtime.config import RunConfig
from sac_edge.edge_runtime.ros2.parameters import run_config
from sac_edge.edge_runtime.runtime import Runtime


def main() -> None:
    bundle_dir, recording = sys.argv[1], sys.argv[2]
    flags = {k: parse_value(RunConfig, k, v) for k, v in (kv.split("=", 1) for kv in sys.argv[3:])}
    layout = bundle_layout(open_bundle(bundle_dir))
    assert layout is not None
    obs = np.empty(layout.obs_dim, np.float32)
    pending, compared, equal, stale_events, first_mismatch = None, 0, 0, [], None
    origins: list[dict] = []  # each ramp_origin event with the command sent next
    with Runtime(run_config(bundle_dir, flags).check()) as runtime:
        for item in read_ros2_messages(recording):
            topic, msg = item.channel.topic, item.ros_msg
            if topic.endswith("joint_states"):
                fields = {"position": msg.position, "velocity": msg.velocity, "effort": msg.effort}
                layout.gather(obs, layout.joint_map(list(msg.name)), fields, {})
                pending = runtime.act(obs).copy()
                runtime.tick()
            elif topic.endswith("commands") and origins and "next_command" not in origins[-1]:
                origins[-1]["next_command"] = list(msg.data)
            if topic.endswith("commands") and pending is not None:
                expected = layout.command_vector(pending).tolist()
                compared += 1
                if list(msg.data) == expected:
                    equal += 1
                elif first_mismatch is None:
                    first_mismatch = {"step": compared, "node": list(msg.data), "runtime": expected}
                pending = None
            elif topic.endswith("events"):
                record = json.loads(msg.data)
                if record.get("type") == "stale":
                    stale_events.append(record)
                elif record.get("type") == "ramp_origin":
                    origins.append(record)
    summary = runtime.summary()
    print(json.dumps({"compared": compared, "equal": equal, "first_mismatch": first_mismatch, "stale": stale_events,
                      "overruns": summary.inference_overruns, "ramp_origins": origins}))  # fmt: skip


if __name__ == "__main__":
    main()
