"""Threat: a sweep's Ray reachable from the network. The embedded Ray of ``sac-sweep`` must listen on the
loopback only, whether or not ray was imported before the sweep started (here it is: at collection, as a
notebook or another library would) and whatever the environment says. Every listening socket of this
process and of every process it started (GCS, raylet, agents, workers) is read from ``/proc``."""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")
import ray  # before the sweep's own code sets anything up

from sac_edge.sweep.tune_run import ray_session

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads listeners from /proc")

TCP_LISTEN = "0A"


def _tree(root: int) -> set[int]:
    """``root`` and every live descendant."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, grew = {root}, True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= new
        grew = bool(new)
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # /proc prints 32-bit words host-order
    return ipaddress.IPv6Address(words)


def _bound(path: str, listening_only: bool) -> dict[str, tuple[str, int]]:
    """inode -> (address, port) of the sockets in ``/proc/net/{tcp,tcp6,udp,udp6}``."""
    out = {}
    for line in Path(path).read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if listening_only and state != TCP_LISTEN:
            continue
        addr, port = local.split(":")
        out[inode] = (str(_address(addr)), int(port, 16))
    return out


def _listeners(pids: set[int]) -> list[tuple[int, str, int]]:
    sockets = {}
    for name in ("tcp", "tcp6"):
        sockets.update(_bound(f"/proc/net/{name}", listening_only=True))
    for name in ("udp", "udp6"):
        sockets.update(_bound(f"/proc/net/{name}", listening_only=False))
    found = []
    for pid in pids:
        for inode in _socket_inodes(pid):
            if inode in sockets:
                found.append((pid, *sockets[inode]))
    return found


def _is_loopback(text: str) -> bool:
    addr = ipaddress.ip_address(text)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def test_every_listener_of_the_local_ray_is_on_the_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "ray" in sys.modules  # the case that broke: ray imported before the sweep
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")  # and the variable set against it
    with ray_session(None, 1, {"cpu": 1, "gpu": 0}):

        @ray.remote
        def pid() -> int:
            return os.getpid()

        worker = ray.get(pid.remote())  # a worker process with its own gRPC server
        pids = _tree(os.getpid())
        assert worker in pids
        listeners = _listeners(pids)
    assert len({pid for pid, _, _ in listeners}) >= 3, listeners  # driver, GCS, raylet at least
    exposed = [entry for entry in listeners if not _is_loopback(entry[1])]
    assert not exposed, f"listening beyond the loopback: {exposed}"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "1"  # the caller's setting restored
