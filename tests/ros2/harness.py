"""Real ROS 2 for the tests: processes of the ROS venv (``make venv-ros2``: ROS 2 Kilted's PyPI wheels, never in
.venv), each in its own process group and killed by group, on a ROS_DOMAIN_ID of this run's own, with Fast
DDS held to 127.0.0.1 over UDP by ``fastdds_loopback.xml`` (nothing in /dev/shm).

The machine may run other ROS 2 processes (a developer's own robot stack, another test run): each test's
domain is reserved from 150-232, outside the 0-101 users are told to pick from, checked free of sockets
and locked against other runs of this harness; /dev/shm is judged by what no live process holds."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import resource
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = ROOT / ".venv-ros2"
PYTHON = VENV / "bin" / "python"
PROFILE = HERE / "fastdds_loopback.xml"
DOMAINS = range(150, 233)
"""The domains the tests may take: above the 0-101 ROS 2's docs tell users to choose from, up to 232, the
highest whose ports (7400 + 250 * domain, + 10 + 2 * participant for unicast) fit in 16 bits."""
_PORTS_PER_DOMAIN, _PORT_BASE = 250, 7400
_held: list[tuple[int, int]] = []  # (domain, lock fd) of the latest reservations of this process


def why_not() -> str | None:
    """Why the ROS 2 tests cannot run here (None: they can)."""
    if not (VENV / ".installed-stamp").is_file():
        log = ROOT / ".venv-ros2.log"
        return "no ROS 2 venv (make venv-ros2 builds it" + (f"; it failed, see {log})" if log.is_file() else ")")
    return None


def ros_env() -> dict[str, str]:
    """The environment of every process of one test: its own domain, loopback-only Fast DDS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROS_", "FASTRTPS_", "FASTDDS_", "RMW_"))}
    env.update(
        ROS_DOMAIN_ID=str(reserve_domain()),
        RMW_IMPLEMENTATION="rmw_fastrtps_cpp",
        FASTDDS_DEFAULT_PROFILES_FILE=str(PROFILE),  # Humble's Fast DDS 2.6 reads FASTRTPS_DEFAULT_PROFILES_FILE
        PYTHONUNBUFFERED="1",
    )
    return env


def _domain_ports(domain: int) -> range:
    return range(_PORT_BASE + _PORTS_PER_DOMAIN * domain, _PORT_BASE + _PORTS_PER_DOMAIN * (domain + 1))


def _candidates() -> list[int]:
    """``DOMAINS`` less those whose ports the kernel may hand out as ephemeral ones (Linux's 32768-60999 by
    default leaves 215-232), unless that leaves none."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return list(DOMAINS)
    clear = [d for d in DOMAINS if _domain_ports(d)[-1] < low or _domain_ports(d)[0] > high]
    return clear or list(DOMAINS)


def _domains_in_use() -> set[int]:
    """Domains with a UDP socket bound on one of their ports, by any process (``ss``)."""
    out = subprocess.run(["ss", "-uanH"], capture_output=True, text=True, check=True).stdout
    ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if len(line.split()) > 3}
    return {(p - _PORT_BASE) // _PORTS_PER_DOMAIN for p in ports if p >= _PORT_BASE}


def reserve_domain(keep: int = 2) -> int:
    """A domain no socket uses and no other run of this harness holds (a lock file per domain), other than the
    ones this process took last; this process keeps the ``keep`` latest locked (one test's, and the last)."""
    candidates, busy = _candidates(), _domains_in_use()
    start = (os.getpid() + len(_held)) % len(candidates)
    mine = {d for d, _ in _held}
    for domain in candidates[start:] + candidates[:start]:
        if domain in busy or domain in mine:
            continue
        fd = os.open(Path(tempfile.gettempdir()) / f"sac-edge-ros-domain-{domain}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held.append((domain, fd))
        while len(_held) > keep:
            os.close(_held.pop(0)[1])  # closing the descriptor releases its lock
        return domain
    raise AssertionError(f"no free ROS domain among {candidates[0]}-{candidates[-1]}: all in use or held by other runs")


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
        """The JSON lines of its stdout, parsed as strict parsers (jq, JavaScript, Go) do: NaN or Infinity fails."""
        lines = self.text(name).splitlines()
        return [json.loads(line, parse_constant=_not_json) for line in lines if line.startswith("{")]

    def pids(self) -> list[int]:
        return [p.pid for p, _, _ in self.procs.values() if p.poll() is None]

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name, signal.SIGKILL, timeout=10)
            _, out, err = self.procs[name]
            out.close()
            err.close()


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} in a JSON line: not JSON (a missing figure is null)")


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
    """What /dev/shm holds that could be a leftover of this harness's processes: not lttng-ust's per-user wait
    files (``lttng-ust-wait-UID``, made once per user by the tracing library the ROS wheels load, and reused),
    nothing a live process has open or mapped (with its ``sem.NAME_mutex``), and no Fast DDS port file
    (``fastdds_port7411``) of a domain outside ``DOMAINS``. Another ROS 2 process on the machine, started or
    ended meanwhile, then never shows: a test comparing this before and after sees what its own processes left."""
    root = Path("/dev/shm")
    if not root.is_dir():
        return set()
    names = {p.name for p in root.iterdir() if not p.name.startswith("lttng-ust-wait-")}
    held = _held_in(root) if names else set()
    return {n for n in names if n not in held and _unprefixed(n) not in held and not _foreign_port(n)}


def _unprefixed(name: str) -> str:
    """A named semaphore's segment (``sem.X_mutex``) -> what it guards (``X``)."""
    return name.removeprefix("sem.").removesuffix("_mutex")


def _foreign_port(name: str) -> bool:
    """A Fast DDS shared-memory port file of a domain the harness never uses."""
    found = re.search(r"_port(\d+)", name)
    return found is not None and (int(found[1]) - _PORT_BASE) // _PORTS_PER_DOMAIN not in DOMAINS


def _held_in(root: Path) -> set[str]:
    """Names under ``root`` that a live process has open (/proc/PID/fd) or mapped (/proc/PID/maps)."""
    held: set[str] = set()
    prefix = f"{root}/"
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (proc / "maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1]
                if path.startswith(prefix):
                    held.add(path[len(prefix) :].split("/")[0].removesuffix(" (deleted)"))
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(prefix):
                        held.add(target[len(prefix) :].split("/")[0])
    return held


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
