"""The state-message-to-command path through ROS 2: ``sac-edge ros2`` (message mode) against a bare rclpy echo
node (the floor for a Python node: subscribe, publish), against the same echo running the bare onnxruntime call
of the bundle's model before each publish (``echo+ort``: the floor of any node that runs the policy), and
against the in-process ``Runtime`` step (the same layout gather, ``act`` and command, no ROS), at each rate, in
one run.

A stimulus node in this process publishes a ``JointState`` at each slot of the rate and waits for the command
it causes (ping-pong, so each reply is matched to its message); latency is publish -> reply as the stimulus
sees it. CPU per step is the target process's user + system time over the measured window divided by its
replies. Every socket stays on 127.0.0.1 (tests/ros2/fastdds_loopback.xml) on a domain of its own.

Run it with the ROS venv's Python (``make venv-ros2``) on a bundle exported with ``--layout``::

    .venv-ros2/bin/python bench/ros2_loop.py --bundle runs/ros2-bundle --rates 200,1000 --seconds 6

Prints a table, the node against each floor (CPU per step as a ratio and as added microseconds), and one JSON
line (``over_echo``: per rate, the node minus each floor: ``added_p50_us``, ``added_p99_us``, ``added_cpu_us``,
``cpu_ratio``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "ros2" / "fastdds_loopback.xml"
STATE, COMMAND = "/joint_states", "/forward_command_controller/commands"
#: A reply later than this counts as lost (and the stimulus waits as long again before its next message, so that
#: a late reply is never matched to the next message).
REPLY_TIMEOUT_NS = 200_000_000


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROS_", "FASTRTPS_", "FASTDDS_", "RMW_"))}
    env.update(
        ROS_DOMAIN_ID=str(os.getpid() % 90 + 10),  # a domain of its own (Fast DDS takes 0..232)
        RMW_IMPLEMENTATION="rmw_fastrtps_cpp",
        FASTDDS_DEFAULT_PROFILES_FILE=str(PROFILE),  # Humble's Fast DDS 2.6 reads FASTRTPS_DEFAULT_PROFILES_FILE
    )
    return env


def _qos() -> Any:
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def echo(executor_kind: str, ns: str, bundle: str = "") -> None:
    """The floor: a bare rclpy node that answers each JointState with its positions, on rclpy's
    SingleThreadedExecutor (``single``) or EventsExecutor (``events``), spun with ``spin_once`` as the node is.
    With ``bundle``: the floor of any node that runs the policy, the same echo with the bare onnxruntime call
    (``session.run_with_iobinding`` on the bundle's fp32 model, the backend's own session and bound buffers,
    as the node's backend builds them) before each publish."""
    import rclpy
    from rclpy.node import Node
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda n, f: stop.append(n))
    node = Node("echo")
    pub = node.create_publisher(Float64MultiArray, ns + COMMAND, _qos())
    out = Float64MultiArray()
    infer = _bare_inference(bundle) if bundle else None

    def on_state(msg: Any) -> None:
        out.data = list(msg.position)
        pub.publish(out)

    def on_state_inferring(msg: Any) -> None:
        infer()  # type: ignore[misc]
        out.data = list(msg.position)
        pub.publish(out)

    node.create_subscription(JointState, ns + STATE, on_state if infer is None else on_state_inferring, _qos())
    from sac_edge.edge_runtime.ros2.node import make_executor

    executor = make_executor(executor_kind)
    executor.add_node(node)
    while not stop:
        executor.spin_once(timeout_sec=0.1)
    rclpy.try_shutdown()


def _bare_inference(bundle: str) -> Any:
    """The bundle's fp32 onnxruntime call without the backend's wrapper (``Backend.bare_call``)."""
    from sac_edge.common.bundle import open_bundle
    from sac_edge.edge_runtime.backends.registry import open_backend

    call = open_backend(open_bundle(bundle), "onnxruntime", "fp32").bare_call()
    call()
    return call


def _cpu(pid: int) -> float:
    """User + system seconds of ``pid`` and its children (the ROS wheels' bootstrapper may run a child)."""
    total = 0.0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.is_file():
        pids += [int(x) for x in children.read_text().split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += sum(int(x) for x in fields[11:13]) / os.sysconf("SC_CLK_TCK")
    return total


def _row(name: str, rate: int, lat_ns: list[int], sent: int, cpu_s: float, seconds: float) -> dict[str, Any]:
    us = np.asarray(lat_ns, dtype=np.float64) / 1e3
    replies = len(lat_ns)
    return {
        "path": name,
        "rate_hz": rate,
        "p50_us": float(np.percentile(us, 50)) if replies else float("nan"),
        "p99_us": float(np.percentile(us, 99)) if replies else float("nan"),
        "replies": replies,
        "lost": sent - replies,
        "cpu_us_per_step": cpu_s * 1e6 / replies if replies else float("nan"),
        "cpu_core_pct": 100.0 * cpu_s / seconds,
        "achieved_hz": sent / seconds,
    }


class Target:
    """A target process on its own topics, and the stimulus's publisher and subscription for it."""

    def __init__(self, node: Any, name: str, proc: subprocess.Popen[str], ns: str, joints: list[str]) -> None:
        from sensor_msgs.msg import JointState
        from std_msgs.msg import Float64MultiArray

        self.name, self.proc, self.node = name, proc, node
        self.pub = node.create_publisher(JointState, ns + STATE, _qos())
        self.got: list[int] = []
        node.create_subscription(
            Float64MultiArray, ns + COMMAND, lambda m: self.got.append(time.monotonic_ns()), _qos()
        )
        self.msg = JointState()
        self.msg.name = joints
        self.lat: list[int] = []
        self.segment_p50: list[float] = []
        self.sent = 0
        self.cpu_s = self.seconds = 0.0
        self.rng = np.random.default_rng(0)

    def wait_ready(self) -> None:
        """Until the target answers a state (its configure included)."""
        import rclpy

        n = len(self.msg.name)
        self.msg.position, self.msg.velocity, self.msg.effort = [0.1] * n, [0.0] * n, [0.0] * n
        end = time.monotonic() + 120
        while not self.got and time.monotonic() < end:
            self.pub.publish(self.msg)
            rclpy.spin_once(self.node, timeout_sec=0.2)
        if not self.got:
            raise SystemExit(f"{self.name} never answered a state; see its log")

    def segment(self, rate: int, seconds: float, keep: bool) -> None:
        """Ping-pong for ``seconds``: a state each slot, its reply awaited (a reply later than REPLY_TIMEOUT_NS
        is lost, and as long again passes before the next state, so that no late reply is matched to it)."""
        import rclpy

        period, got, msg, lat = int(1e9 / rate), self.got, self.msg, []
        cpu0, start = _cpu(self.proc.pid), time.monotonic_ns()
        slot, n = start, 0
        while slot - start < seconds * 1e9:
            got.clear()
            msg.position = self.rng.uniform(-1, 1, len(msg.name)).tolist()
            t = time.monotonic_ns()
            self.pub.publish(msg)
            n += 1
            while not got and time.monotonic_ns() < t + REPLY_TIMEOUT_NS:
                rclpy.spin_once(self.node, timeout_sec=0.01)
            if got:
                lat.append(got[0] - t)
            else:
                end = time.monotonic_ns() + REPLY_TIMEOUT_NS
                while time.monotonic_ns() < end:
                    rclpy.spin_once(self.node, timeout_sec=0.01)
            slot = max(slot + period, time.monotonic_ns())  # the next slot, or now when late
            while time.monotonic_ns() < slot:
                time.sleep(max(0.0, (slot - time.monotonic_ns()) / 1e9))
        if keep:
            self.lat += lat
            self.sent += n
            self.cpu_s += _cpu(self.proc.pid) - cpu0
            self.seconds += (time.monotonic_ns() - start) / 1e9
            if lat:
                self.segment_p50.append(float(np.median(lat)) / 1e3)

    def row(self, rate: int) -> dict[str, Any]:
        out = _row(self.name, rate, self.lat, self.sent, self.cpu_s, self.seconds)
        out["segment_p50_median_us"] = float(np.median(self.segment_p50)) if self.segment_p50 else float("nan")
        return out


def paired(targets: list[Target], rate: int, seconds: float, segment_s: float) -> list[dict[str, Any]]:
    """The targets in alternating segments (the first one alternates too), so that both see the same load."""
    for t in targets:
        t.wait_ready()
        t.segment(rate, 0.5, keep=False)  # warm-up
    rounds = max(1, round(seconds / segment_s))
    for r in range(rounds):
        for t in targets if r % 2 == 0 else targets[::-1]:
            t.segment(rate, segment_s, keep=True)
    return [t.row(rate) for t in targets]


def in_process(bundle: str, rate: int, seconds: float) -> dict[str, Any]:
    """The same step without ROS: the layout's gather, ``Runtime.act``, the command vector, at the rate."""
    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout
    from sac_edge.edge_runtime.ros2.parameters import run_config
    from sac_edge.edge_runtime.runtime import Runtime

    layout = bundle_layout(open_bundle(bundle))
    assert layout is not None
    joints = list(layout.state_joints)
    jmap = layout.joint_map(joints)
    obs = np.empty(layout.obs_dim, np.float32)
    cmd: np.ndarray = np.empty(layout.act_dim, np.float64)
    rng = np.random.default_rng(0)
    lat: list[int] = []
    period = int(1e9 / rate)
    options = run_config(bundle, {"backend": "onnxruntime", "precision": "fp32", "rate_hz": float(rate)}).check()
    with Runtime(options) as runtime:
        cpu0, start = time.process_time(), time.monotonic_ns()
        slot, n = start, 0
        while slot - start < seconds * 1e9:
            fields = {"position": rng.uniform(-1, 1, len(joints)).tolist(), "velocity": [0.0] * len(joints),
                      "effort": [0.0] * len(joints)}  # fmt: skip
            t = time.monotonic_ns()
            layout.gather(obs, jmap, fields, {})
            layout.command_vector(runtime.act(obs), cmd)
            lat.append(time.monotonic_ns() - t)
            n += 1
            slot += period
            while time.monotonic_ns() < slot:
                time.sleep(max(0.0, (slot - time.monotonic_ns()) / 1e9))
        cpu_s = time.process_time() - cpu0
    return _row("in-process Runtime", rate, lat, n, cpu_s, seconds)


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with open(log, "w") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--bundle", help="a bundle exported with --layout (its joints are the state's)")
    ap.add_argument("--rates", default="200,1000", help="comma-separated rates in Hz")
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per path and rate")
    ap.add_argument("--segment", type=float, default=0.5, help="seconds per segment; the targets alternate")
    ap.add_argument("--logs", default="runs/ros2-loop", help="directory for the target processes' output")
    ap.add_argument("--executors", default="single,events", help="rclpy executors to run each target on")
    ap.add_argument("--echo", default="", help=argparse.SUPPRESS)  # EXECUTOR,NAMESPACE[,BUNDLE]: run as an echo
    return ap


def measure_rate(args: argparse.Namespace, rate: int, joints: list[str], env: dict[str, str]) -> list[dict[str, Any]]:
    """The echo and the node at ``rate`` (paired, each in its own process), then the in-process Runtime."""
    from rclpy.node import Node

    starts = {}
    for kind in args.executors.split(","):
        ns = f"/policy_{kind}"
        node_cmd = [
            sys.executable, "-m", "sac_edge.edge_runtime.cli", "ros2", args.bundle, "--ros-args", "-r", f"__ns:={ns}",
            "-p", "autostart:=true", "-p", "mode:=message", "-p", "backend:=onnxruntime", "-p", "precision:=fp32",
            "-p", "state_qos_reliability:=reliable", "-p", "max_input_age_ms:=1000.0", "-p", f"rate_hz:={rate}.0",
            "-p", f"executor:={kind}",
        ]  # fmt: skip
        starts[f"rclpy echo {kind}"] = ([sys.executable, __file__, "--echo", f"{kind},/echo_{kind}"], f"/echo_{kind}")
        floor = [sys.executable, __file__, "--echo", f"{kind},/floor_{kind},{args.bundle}"]
        starts[f"echo+ort {kind}"] = (floor, f"/floor_{kind}")
        starts[f"sac-edge ros2 {kind}"] = (node_cmd, ns)
    stimulus = Node(f"stimulus_{rate}")
    procs, targets = [], []
    try:
        for name, (cmd, ns) in starts.items():
            procs.append(_start(cmd, env, Path(args.logs) / f"{name.replace(' ', '-')}-{rate}.log"))
            targets.append(Target(stimulus, name, procs[-1], ns, joints))
        rows = paired(targets, rate, args.seconds, args.segment)
    finally:
        for proc in procs:
            _stop(proc)
        stimulus.destroy_node()
    return [*rows, in_process(args.bundle, rate, args.seconds)]


def report(rows: list[dict[str, Any]], load_start: tuple[float, float, float]) -> None:
    """The table, then the JSON line with what the node adds over the echo at each rate."""
    print(f"{'path':<22} {'rate':>6} {'sent/s':>7} {'p50 us':>9} {'seg p50':>8} {'p99 us':>9} {'replies':>8} "
          f"{'lost':>5} {'CPU us/step':>12} {'core %':>7}")  # fmt: skip
    for r in rows:
        seg = r.get("segment_p50_median_us", float("nan"))
        print(f"{r['path']:<22} {r['rate_hz']:>6} {r['achieved_hz']:>7.0f} {r['p50_us']:>9.1f} {seg:>8.1f} "
              f"{r['p99_us']:>9.1f} {r['replies']:>8} {r['lost']:>5} {r['cpu_us_per_step']:>12.1f} "
              f"{r['cpu_core_pct']:>7.1f}")  # fmt: skip
    by = {(r["path"], r["rate_hz"]): r for r in rows}
    added: dict[str, dict[str, float]] = {}
    for (path, rate), node in sorted(by.items()):
        if not path.startswith("sac-edge ros2 "):
            continue
        kind = path.rsplit(" ", 1)[1]
        for floor_name in dict.fromkeys((f"rclpy echo {kind}", "rclpy echo single", f"echo+ort {kind}")):
            floor = by.get((floor_name, rate))
            if floor is not None:
                added[f"{rate} node {kind} vs {floor_name}"] = {
                    "added_p50_us": node["p50_us"] - floor["p50_us"],
                    "added_p99_us": node["p99_us"] - floor["p99_us"],
                    "added_cpu_us": node["cpu_us_per_step"] - floor["cpu_us_per_step"],
                    "cpu_ratio": node["cpu_us_per_step"] / floor["cpu_us_per_step"],
                }
    for name, r in added.items():
        cpu = f"CPU per step {r['cpu_ratio']:.2f}x ({r['added_cpu_us']:+.0f} us)"
        print(f"{name}: {cpu}, p50 {r['added_p50_us']:+.0f} us")
    load = os.getloadavg()
    print(json.dumps({"bench": "ros2_loop", "rows": rows, "over_echo": added, "loadavg_start": load_start,
                      "loadavg": load}))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.echo:
        kind, ns, *bundle = args.echo.split(",", 2)
        return echo(kind, ns, *bundle)
    if not args.bundle:
        ap.error("--bundle is required")
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from sac_edge.common.bundle import open_bundle
    from sac_edge.common.io_layout import bundle_layout

    layout = bundle_layout(open_bundle(args.bundle))
    if layout is None:
        ap.error(f"{args.bundle} has no layout: export it with sac-export --layout FILE")
    joints = list(layout.state_joints)
    env = _env()
    os.environ.update(env)
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    load_start = os.getloadavg()
    rows = []
    for rate in (int(r) for r in args.rates.split(",")):
        rows += measure_rate(args, rate, joints, env)
    rclpy.try_shutdown()
    report(rows, load_start)


if __name__ == "__main__":
    main()
