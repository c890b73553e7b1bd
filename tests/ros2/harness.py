"""Real ROS 2 for the tests: processes of the ROS venv (``make venv-ros2``: ROS 2 Kilted's PyPI wheels, never in
.venv), each in its own process group and killed by group, on a ROS_DOMAIN_ID of this run's own, with Fast
DDS held to 127.0.0.1 over UDP by ``fastdds_loopback.xml`` (nothing in /dev/shm)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = ROOT / ".venv-ros2"
PYTHON = VENV / "bin" / "python"
PROFILE = HERE / "fastdds_loopback.xml"
_DOMAINS = iter(range(1, 100))


def why_not() -> str | None:
    """Why the ROS 2 tests cannot run here (None: they can)."""
    if not (VENV / ".installed-stamp").is_file():
        log = ROOT / ".venv-ros2.log"
        return "no ROS 2 venv (make venv-ros2 builds it" + (f"; it failed, see {log})" if log.is_file() else ")")
    return None


def ros_env() -> dict[str, str]:
    """The environment of every process of one test: its own domain, loopback-only Fast DDS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROS_", "FASTRTPS_", "FASTDDS_", "RMW_"))}
    domain = (os.getpid() + next(_DOMAINS) * 7) % 100 + 1  # 1..100: within Fast DDS's port range
    env.update(
        ROS_DOMAIN_ID=str(domain),
        RMW_IMPLEMENTATION="rmw_fastrtps_cpp",
        FASTDDS_DEFAULT_PROFILES_FILE=str(PROFILE),  # Humble's Fast DDS 2.6 reads FASTRTPS_DEFAULT_PROFILES_FILE
        PYTHONUNBUFFERED="1",
    )
    return env


class Procs:
    """The processes of one test, each started in its own session (process group) and ended by group."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env, self.log_dir, self.procs = env, log_dir, {}  # type: ignore[var-annotated]

    def start(self, name: str, *args: str, file_limit: int | None = None) -> subprocess.Popen[str]:
        """Start ``python ARGS``; ``file_limit``: no file it writes may grow past this many bytes (a write past
        it fails with EFBIG, as a full disk fails one with ENOSPC)."""
        out = open(self.log_dir / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
        err = open(self.log_dir / f"{name}.err", "w")  # noqa: SIM115

        def limit() -> None:
            if file_limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of the process

        proc = subprocess.Popen([str(PYTHON), *args], env=self.env, cwd=ROOT, stdout=out, stderr=err, text=True,
                                start_new_session=True, preexec_fn=limit)  # fmt: skip
        self.procs[name] = (proc, out, err)
        return proc

    def node(
        self,
        bundle: Path,
        *params: str,
        name: str = "node",
        params_file: Path | None = None,
        remaps: tuple[str, ...] = (),
        humble: bool = False,
        file_limit: int | None = None,
        program: str = "",
    ) -> subprocess.Popen[str]:
        """``sac-edge ros2 BUNDLE --ros-args [--params-file FILE] -r ... -p ...`` of the ROS venv; ``humble``: with
        Humble's lifecycle code and no ``rclpy.wait_for_message`` (humble.py); ``program``: another wrapper of
        the command under tests/ros2 (faulty.py)."""
        ros = (["--params-file", str(params_file)] if params_file else []) + [x for r in remaps for x in ("-r", r)]
        ros += [x for p in params for x in ("-p", p)]
        wrapper = f"tests/ros2/{program}" if program else "tests/ros2/humble.py" if humble else ""
        command = [wrapper] if wrapper else ["-m", "sac_edge.edge_runtime.cli"]
        return self.start(name, *command, "ros2", str(bundle), "--ros-args", *ros, file_limit=file_limit)

    def run(self, name: str, *args: str, timeout: float = 120) -> list[dict]:
        """Run to the end; its stdout's JSON lines."""
        proc = self.start(name, *args)
        try:
            proc.wait(timeout=timeout)
        finally:
            self.send(name, signal.SIGKILL)
        return self.json_lines(name)

    def send(self, name: str, signum: int) -> None:
        proc = self.procs[name][0]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    def stop(self, name: str, signum: int = signal.SIGINT, timeout: float = 30) -> int:
        """Signal the group, wait; SIGKILL the group if it does not end."""
        self.send(name, signum)
        proc = self.procs[name][0]
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.send(name, signal.SIGKILL)
            return proc.wait(timeout=10)

    def text(self, name: str, stream: str = "out") -> str:
        handle = self.procs[name][1 if stream == "out" else 2]
        if not handle.closed:
            handle.flush()
        return (self.log_dir / f"{name}.{stream}").read_text()

    def json_lines(self, name: str) -> list[dict]:
        return [json.loads(line) for line in self.text(name).splitlines() if line.startswith("{")]

    def pids(self) -> list[int]:
        return [p.pid for p, _, _ in self.procs.values() if p.poll() is None]

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name, signal.SIGKILL, timeout=10)
            _, out, err = self.procs[name]
            out.close()
            err.close()


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def sockets(pids: list[int]) -> list[str]:
    """Local addresses of every UDP and TCP socket the processes (and their children) hold (``ss``)."""
    out = subprocess.run(["ss", "-uatnpH"], capture_output=True, text=True, check=True).stdout
    wanted = {f"pid={p}," for p in pids}
    return [line.split()[4] for line in out.splitlines() if any(w in line for w in wanted)]


def shm() -> set[str]:
    """What /dev/shm holds, but lttng-ust's per-user wait files (``lttng-ust-wait-UID``, 4 KiB, made once per user
    by the tracing library the ROS wheels load, and reused: not a per-process leftover)."""
    root = Path("/dev/shm")
    return {p.name for p in root.iterdir() if not p.name.startswith("lttng-ust-wait-")} if root.is_dir() else set()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its waited-for children (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def ros_children(proc: subprocess.Popen[str]) -> Iterator[int]:
    """The process and its children: the wheels' bootstrapper re-executes the interpreter as a child."""
    yield proc.pid
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    if children.is_file():
        yield from (int(x) for x in children.read_text().split())
