"""A simulated robot for the ROS 2 tests, in its own process (the ROS venv): publishes sensor_msgs/JointState,
takes std_msgs/Float64MultiArray commands.

``pendulum``: Pendulum-v1's dynamics (gymnasium's equations), one joint ``pendulum`` (effort). ``multi``: N
joints ``j0..`` of damped double integrators driven by effort, plus an unused ``gripper`` joint.
``--prefix /ns``: every topic under that namespace; ``--split``: each state as two JointStates (an arm
driver's and a gripper driver's). ``--lockstep``: the next state is published when a command arrives (a step
per command; the state is sent again every 0.2 s while no command comes). Else states go out at ``--rate-hz``
and the latest command applies. ``--pause-at S --pause-s D``: stop publishing D seconds from S s after the
first command; ``--freeze-at S``: from S s after it, the same values (a stuck sensor);
``--clock-speed X``: /clock at X times wall time. On SIGINT/SIGTERM:
writes ``--out`` (JSON: commands received, states published, publish times) and exits.
``--controller``: the robot's own controller too (a stand-in for a ros2_control controller a human tunes): after
each state it publishes a command on the command topic (a damped pull to 0 plus seeded noise), which the robot
applies as any command; a node in shadow mode beside it commands nothing."""

from __future__ import annotations

import argparse
import json
import math
import random
import signal
import time

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64, Float64MultiArray


def pendulum(state: list[float], u: float, g: float = 10.0, dt: float = 0.05) -> list[float]:
    th, thdot = state
    u = min(max(u, -2.0), 2.0)
    thdot = min(max(thdot + (3 * g / 2 * math.sin(th) + 3.0 * u) * dt, -8.0), 8.0)
    return [th + thdot * dt, thdot]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=("pendulum", "multi"), default="pendulum")
    ap.add_argument("--joints", type=int, default=6)
    ap.add_argument("--names", default="", help="comma-separated joint names instead of the kind's")
    ap.add_argument("--lockstep", action="store_true")
    ap.add_argument("--rate-hz", type=float, default=200.0)
    ap.add_argument("--pause-at", type=float, default=-1.0)
    ap.add_argument("--pause-s", type=float, default=0.0)
    ap.add_argument("--reward", action="store_true", help="a reward per command on /reward, /episode_end every 100")
    ap.add_argument("--command-qos", choices=("reliable", "best_effort"), default="reliable")
    ap.add_argument("--freeze-at", type=float, default=-1.0, help="from S s after the first command: the same values")
    ap.add_argument("--clock-speed", type=float, default=0.0, help="publish /clock at this speed (0: none)")
    ap.add_argument("--prefix", default="", help="a namespace for every topic (e.g. /robot1)")
    ap.add_argument("--split", action="store_true", help="each state as two JointStates: half the joints each")
    ap.add_argument("--controller", action="store_true", help="publish the robot's own commands after each state")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    stop: list[int] = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda n, f: stop.append(n))
    node = Node("sim")
    if args.kind == "pendulum":
        names = ["pendulum"]
        state = {"pendulum": [2.0, 0.0]}
    else:
        names = [f"j{i}" for i in range(args.joints)] + ["gripper"]
        state = {n: [0.1 * i, 0.0] for i, n in enumerate(names)}
    shown = args.names.split(",") if args.names else names
    pub = node.create_publisher(JointState, f"{args.prefix}/joint_states", 10)
    reward_pub = node.create_publisher(Float64, f"{args.prefix}/reward", 10)
    end_pub = node.create_publisher(Bool, f"{args.prefix}/episode_end", 10)
    record: dict = {"commands": [], "published": 0, "first_command_t": None, "pause": None}
    controller = node.create_publisher(Float64MultiArray, f"{args.prefix}/forward_command_controller/commands", 10) if (
        args.controller) else None  # fmt: skip
    noise = random.Random(0)
    last_command = {"t": 0.0}

    frozen: dict = {}

    def publish() -> None:
        start = record["first_command_t"]
        if args.freeze_at >= 0 and start is not None and time.monotonic() - start >= args.freeze_at and not frozen:
            frozen.update({n: list(v) for n, v in state.items()})  # a stuck sensor: these values from now on
        values = frozen or state
        half = len(names) // 2 if args.split else len(names)
        for part in (slice(0, half), slice(half, None)):
            if not names[part]:
                continue
            msg = JointState()
            msg.header.stamp = node.get_clock().now().to_msg()
            msg.name = shown[part]
            msg.position = [values[n][0] for n in names[part]]
            msg.velocity = [values[n][1] for n in names[part]]
            msg.effort = [0.0] * len(names[part])
            pub.publish(msg)
        record["published"] += 1
        if controller is not None:
            data = [max(-10.0, min(10.0, -5.0 * state[n][0] - 0.5 * state[n][1] + noise.gauss(0.0, 3.0)))
                    for n in names[: len(names) - 1 if args.kind == "multi" else 1]]  # fmt: skip
            controller.publish(Float64MultiArray(data=data))

    def paused() -> bool:
        start = record["first_command_t"]
        if start is None or args.pause_at < 0:
            return False
        t = time.monotonic() - start
        return args.pause_at <= t < args.pause_at + args.pause_s

    def on_command(msg: Float64MultiArray) -> None:
        now = time.monotonic()
        data = list(msg.data)
        record["commands"].append(data)
        if record["first_command_t"] is None:
            record["first_command_t"] = now
        last_command["t"] = now
        if args.kind == "pendulum":
            state["pendulum"] = pendulum(state["pendulum"], data[0])
        else:
            for n, u in zip(names, data):
                x, v = state[n]
                v = 0.98 * v + 0.001 * u
                state[n] = [x + 0.001 * v, v]
        if args.reward:
            reward_pub.publish(Float64(data=-abs(data[0])))
            if len(record["commands"]) % 100 == 0:
                end_pub.publish(Bool(data=False))
        if args.lockstep and not paused():
            publish()

    node.create_subscription(
        Float64MultiArray, f"{args.prefix}/forward_command_controller/commands", on_command,
        QoSProfile(depth=10, reliability=getattr(ReliabilityPolicy, args.command_qos.upper())),
    )  # fmt: skip

    def on_timer() -> None:
        if paused():
            if record["pause"] is None:
                record["pause"] = {"from": time.monotonic() - record["first_command_t"]}
            return
        if not args.lockstep or time.monotonic() - last_command["t"] > 0.2:
            publish()

    node.create_timer(1.0 / args.rate_hz if not args.lockstep else 0.05, on_timer)
    if args.clock_speed:
        from rosgraph_msgs.msg import Clock

        clock_pub, sim_ns = node.create_publisher(Clock, "/clock", 10), [1_000_000_000]

        def on_clock() -> None:  # simulated time: 5 ms of wall time advances it 5 ms x the speed
            sim_ns[0] += int(5_000_000 * args.clock_speed)
            msg = Clock()
            msg.clock.sec, msg.clock.nanosec = divmod(sim_ns[0], 1_000_000_000)
            clock_pub.publish(msg)

        node.create_timer(0.005, on_clock)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    while not stop:
        executor.spin_once(timeout_sec=0.05)
    with open(args.out, "w") as fh:
        json.dump(record, fh)
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
