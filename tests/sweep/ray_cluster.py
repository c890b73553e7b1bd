"""A multi-node Ray cluster on one machine, for sac-sweep's cluster tests.

One network namespace holding only the loopback; in it a head with 0 CPUs and 1-CPU workers, each node in
its own pid and mount namespace with its own /dev/shm, and each worker with its own disk (a tmpfs) over the
folder given as ``private``, as separate machines have. Token authentication is on, as Ray 2.60 defaults.
A node is killed by killing its ``unshare``: the namespace's init dies and the kernel kills everything in it.
Needs root and unshare(1); ``unshare_refusal()`` says why not where it cannot run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
GCS_PORT = 6390
AGENT_PORTS = 52400  # each node's dashboard agent, metrics and runtime-env ports from here up (3 per node)


def unshare_refusal() -> str | None:
    """None where network, pid and mount namespaces can be made here, else why not."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None or shutil.which("ip") is None:
        return "unshare, nsenter or ip (util-linux, iproute2) is not installed"
    if os.geteuid() != 0:
        return "namespaces with their own mounts need root"
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        return f"unshare is not permitted here ({probe.stderr.strip() or probe.returncode})"
    return None


class Cluster:
    """The cluster's namespaces and nodes; ``close()`` kills every process it started, by namespace."""

    def __init__(self, private: Path) -> None:
        self.private = private
        self.work = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
        token = self.work / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        # The holder brings its own loopback up and says so: until unshare(2) has run, /proc/PID/ns/net is
        # still this machine's namespace, and an ``ip link set lo up`` entered from outside can land there,
        # leaving the cluster's lo down (every connect ENETUNREACH, the head's GCS unreachable by its own node).
        self.holder = subprocess.Popen(
            ["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.address = f"127.0.0.1:{GCS_PORT}"
        assert self.holder.stdout is not None and self.holder.stderr is not None
        said = self.holder.stdout.readline().strip()
        link = subprocess.run(self.netns(["ip", "-o", "link", "show", "lo"]), capture_output=True, text=True)
        if said != "up" or ",UP" not in link.stdout:
            self.holder.kill()
            self.holder.wait()
            raise RuntimeError(f"the cluster's loopback did not come up: {said!r} {link.stdout.strip()!r}")

    def netns(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the cluster's network namespace."""
        return ["nsenter", f"--net=/proc/{self.holder.pid}/ns/net", "--", *argv]

    def start(self, name: str, cpus: int) -> None:
        """Start a node (the first one is the head) in pid and mount namespaces of its own."""
        index = len(self.nodes)
        ports = AGENT_PORTS + 3 * index
        temp = self.work / name
        temp.mkdir()
        mounts = ["mount -t tmpfs -o size=256m tmpfs /dev/shm"]
        if index:  # a worker's own disk (its trials' run dirs too: TMPDIR); the head's temp dir holds the
            # sockets the driver beside it connects to
            mounts += [f"mount -t tmpfs tmpfs {temp}", f"mount -t tmpfs tmpfs {self.private}", f"export TMPDIR={temp}"]
        join = (
            ["--head", f"--port={GCS_PORT}", "--ray-client-server-port=6391"]
            if not index
            else [f"--address={self.address}"]
        )
        ray = [
            str(BIN / "ray"), "start", "--block", *join, f"--num-cpus={cpus}", "--num-gpus=0",
            "--node-ip-address=127.0.0.1", f"--temp-dir={temp}", "--object-store-memory=80000000",
            "--include-dashboard=false" if not index else "--disable-usage-stats",
            f"--dashboard-agent-listen-port={ports}", f"--metrics-export-port={ports + 1}",
            f"--runtime-env-agent-port={ports + 2}", "--disable-usage-stats",
        ]  # fmt: skip
        script = " && ".join([*mounts, "exec " + " ".join(ray)])
        unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 (the node's lifetime)
        self.nodes[name] = subprocess.Popen(
            self.netns([*unshare, "sh", "-c", script]), env=self.env, stdout=log, stderr=log, start_new_session=True
        )

    def alive(self) -> int:
        """How many nodes the head counts alive (asked from inside the namespace)."""
        code = (
            "import ray;from ray._raylet import GcsClient;"
            f"print(sum(n.state == 0 for n in GcsClient(address='{self.address}').get_all_node_info().values()))"
        )
        out = subprocess.run(self.netns([sys.executable, "-c", code]), env=self.env, capture_output=True, text=True)
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0

    def wait_alive(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.alive() != count:
            if time.monotonic() > deadline:
                logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self.work.glob("*.log")}
                raise RuntimeError(f"the cluster did not reach {count} alive nodes: {logs}")
            time.sleep(1.0)

    def kill(self, name: str) -> None:
        """Kill a node outright, as a machine that loses power."""
        node = self.nodes.pop(name)
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()

    def listeners(self) -> list[str]:
        """Every listening TCP address in the namespace (``ip:port``, IPv4 and IPv6)."""
        out = subprocess.run(self.netns(["ss", "-Hltn"]), capture_output=True, text=True, check=True).stdout
        return [line.split()[3] for line in out.splitlines() if line.strip()]

    def sweep(self, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
        """``sac-sweep argv`` started inside the namespace (on the head's machine: this one's disk)."""
        return subprocess.Popen(
            self.netns([str(BIN / "sac-sweep"), *argv]), env={**self.env, **kw.pop("env", {})}, text=True,
            start_new_session=True, **kw,
        )  # fmt: skip

    def close(self) -> None:
        for name in list(self.nodes):
            self.kill(name)
        os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.communicate()
        shutil.rmtree(self.work, ignore_errors=True)


def start_cluster(private: Path, cpus: dict[str, int]) -> Cluster:
    """A cluster of ``cpus`` (node name -> CPUs, the first the head) with every node alive."""
    nodes = Cluster(private)
    try:
        head, *workers = cpus
        nodes.start(head, cpus[head])
        nodes.wait_alive(1)  # the workers join a GCS that answers, not one still starting
        for name in workers:
            nodes.start(name, cpus[name])
        nodes.wait_alive(len(cpus))
        return nodes
    except BaseException:
        nodes.close()
        raise
