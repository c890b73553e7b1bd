"""``sac-edge``: ``run`` (the control loop on a bundle), ``bench`` (latency per backend x precision x batch) and
``doctor`` (what this device is and what will run on it).

Conventions (docs/CONTRACTS.md): with ``--json`` the last stdout line is one JSON object; errors are one line on
stderr with exit code 2 (bad input) or 1 (internal); Ctrl-C / SIGTERM during ``run`` stop the loop
cleanly and still print the summary.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from sac_edge.common.config import parse_config, version_line
from sac_edge.common.errors import SacEdgeError, run_cli
from sac_edge.common.summary import emit_json

from .config import BenchConfig, DoctorConfig, DrillConfig, RunConfig

PROG = "sac-edge"
USAGE = f"""usage: {PROG} {{run,bench,drill,doctor}} BUNDLE [options] | {PROG} ros2 BUNDLE [--ros-args ...] |
       {PROG} replay BUNDLE RECORDING [options] | {PROG} keygen NAME

  run     drive an environment with the bundle's policy at a fixed rate, within budgets
  bench   latency, throughput, energy and memory per backend x precision x batch
  drill   inject sensor faults (NaN, stuck, spikes, drops, delay, OOD start, weight swap) and measure the
          policy with and without the safety shield on the same seeds
  replay  check a bundle against a robot's recorded log (MCAP / rosbag2) before it commands the robot:
          swapped joints, signs, units, frozen channels, out-of-range values, stale inputs, by joint
  doctor  Python, onnxruntime, TensorRT, CUDA, Jetson release, sensors, permissions; what the bundle can run
  ros2    the bundle's policy as a ROS 2 lifecycle node on the robot's topics (the system's rclpy, Humble
          or newer; settings are ROS parameters: docs/ROS2.md)
  keygen  write an Ed25519 key pair: NAME (private, for sac-export --sign-key) and NAME.pub (for a
          --trusted-keys directory); missing folders are made 0700; a warning where git would commit NAME

'{PROG} COMMAND --help' lists a command's options; '{PROG} --version' prints the version."""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run(argv: Sequence[str]) -> int:
    from .run import raise_env_error, run_command, summary_table
    from .runtime import RunSummary

    cfg = parse_config(RunConfig, argv, f"{PROG} run", RunConfig.__doc__ or "", positional=("bundle",))

    def report(summary: RunSummary) -> None:
        print(summary_table(summary), flush=True)
        if cfg.json:
            emit_json(summary.to_json())
        raise_env_error(summary)

    def on_hang(summary: RunSummary) -> None:
        """On the watchdog's thread: the control thread is stuck inside a backend call that will not return,
        so the process ends here, once the summary is out (exit 1, one line, as for any failed run)."""

        def reported(_: Sequence[str] | None) -> int:
            report(summary)
            return 0

        code = run_cli(PROG, reported, [])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code or 1)

    report(run_command(cfg, log, on_hang))
    return 0


def _bench(argv: Sequence[str]) -> int:
    from .bench import bench_command, bench_table

    cfg = parse_config(BenchConfig, argv, f"{PROG} bench", BenchConfig.__doc__ or "", positional=("bundle",))
    result = bench_command(cfg, log)
    print(bench_table(result["rows"]), flush=True)
    if cfg.json:
        emit_json(result)
    return 0


def _drill(argv: Sequence[str]) -> int:
    from .drill import drill_command, drill_table

    cfg = parse_config(DrillConfig, argv, f"{PROG} drill", DrillConfig.__doc__ or "", positional=("bundle",))
    result = drill_command(cfg, log)
    print(drill_table(result), flush=True)
    if "written" in result:
        log(f"sac-edge drill: results written to {result['written']}")
    if cfg.json:
        emit_json(result)
    return 0


def _replay(argv: Sequence[str]) -> int:
    from .config import ReplayConfig
    from .replayer import EXIT_AGREE, EXIT_MISMATCH, replay_command, replay_table

    cfg = parse_config(
        ReplayConfig, argv, f"{PROG} replay", ReplayConfig.__doc__ or "", positional=("bundle", "recording")
    )
    report = replay_command(cfg, log)
    print(replay_table(report), flush=True)
    if cfg.json:
        emit_json(report)
    return EXIT_MISMATCH if report["verdict"] == "mismatch" else EXIT_AGREE


def _keygen(argv: Sequence[str]) -> int:
    from sac_edge.common.signing import generate_keypair, key_id, load_private_key, unignored_work_tree

    if len(argv) != 1 or argv[0].startswith("-"):
        raise SacEdgeError(f"usage: {PROG} keygen NAME (writes NAME and NAME.pub; missing folders are made 0700)")
    private, public = generate_keypair(argv[0])
    kid = key_id(load_private_key(private).public_key())
    print(f"key {kid}: private {private} (keep it secret), public {public} (copy it into --trusted-keys DIRs)")
    tree = unignored_work_tree(private)
    if tree is not None:
        print(f"{PROG} keygen: warning: the private key {private} is in the git work tree {tree}, which does not "
              "ignore it: a commit would publish it (add it to .gitignore, or keep keys outside the clone, e.g. "
              "~/.config/sac-edge/keys/)", file=sys.stderr)  # fmt: skip
    return 0


def _ros2(argv: Sequence[str]) -> int:
    ours = argv[: list(argv).index("--ros-args")] if "--ros-args" in argv else argv
    if any(a in ("-h", "--help") for a in ours):
        print(f"usage: {PROG} ros2 BUNDLE [--ros-args -p name:=value ... --params-file FILE]\n\n"
              "The bundle's policy as a ROS 2 lifecycle node (docs/ROS2.md lists its parameters).")  # fmt: skip
        return 0
    from sac_edge.edge_runtime.ros2.compat import require_rclpy

    require_rclpy()  # one line where ROS 2 is not sourced or too old, before the node's module imports it
    from sac_edge.edge_runtime.ros2.node import main as ros2_main

    return ros2_main(argv)


def _doctor(argv: Sequence[str]) -> int:
    from .doctor import doctor_command, doctor_json, doctor_table

    cfg = parse_config(DoctorConfig, argv, f"{PROG} doctor", DoctorConfig.__doc__ or "", positional=("bundle",))
    rows = doctor_command(cfg)
    print(doctor_table(rows), flush=True)
    if cfg.json:
        emit_json(doctor_json(rows))
    return 0


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "--version":
        print(version_line(PROG))
        return 0
    command, rest = args[0], args[1:]
    if command == "run":
        return _run(rest)
    if command == "bench":
        return _bench(rest)
    if command == "drill":
        return _drill(rest)
    if command == "keygen":
        return _keygen(rest)
    if command == "doctor":
        return _doctor(rest)
    if command == "ros2":
        return _ros2(rest)
    if command == "replay":
        return _replay(rest)
    raise SacEdgeError(
        f"unknown command {command!r}; use run, bench, drill, doctor, ros2, replay or keygen ({PROG} --help)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    return run_cli(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
