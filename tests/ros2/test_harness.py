"""The ROS 2 tests' harness on a machine with other ROS 2 work running: the domain each test gets lies outside
the users' range, on no port in use and held by no other run; /dev/shm is judged by what its own ended
processes left, never by what another live process holds. (On 27d6dc3 the domain was 1-100 from the pid, and
any other ROS 2 process's /dev/shm segments failed the loopback test.)"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import harness
import pytest

SHM = Path("/dev/shm")


@pytest.fixture
def shm_file() -> Iterator[Path]:
    path = SHM / f"sac-edge-harness-{uuid.uuid4().hex}"
    path.write_bytes(b"\0" * 4096)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("hold", ["open", "mapped"])
def test_shm_counts_an_entry_only_while_no_live_process_holds_it(shm_file: Path, hold: str) -> None:
    assert shm_file.name in harness.shm()  # nobody holds it: a leftover
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(shm_file)!r}, 'r+b')\n"
        + ("m = mmap.mmap(f.fileno(), 4096); f.close()\n" if hold == "mapped" else "")
        + "print('holding', flush=True); time.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "holding"
        assert shm_file.name not in harness.shm()  # another process's own segment, alive
    finally:
        other.kill()
        other.wait()
    assert shm_file.name in harness.shm()


def test_each_domain_is_outside_the_users_range_and_differs_from_the_last() -> None:
    first, second = harness.reserve_domain(), harness.reserve_domain()
    assert first != second and {first, second} <= set(harness.DOMAINS) and min(harness.DOMAINS) > 101


def test_a_domain_with_a_bound_port_or_held_by_another_run_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "_held", [])  # this process's earlier tests keep theirs (their own descriptors)
    picks = [harness.reserve_domain(keep=3) for _ in range(3)]  # free now and held: other runs pass them over
    held = dict(harness._held)
    monkeypatch.setattr(harness, "_candidates", lambda: picks)
    monkeypatch.setattr(harness, "_held", [])
    bound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    bound.bind(("127.0.0.1", harness._domain_ports(picks[0])[11]))  # as a participant's unicast port
    lock = Path(tempfile.gettempdir()) / f"sac-edge-ros-domain-{picks[1]}.lock"
    other = subprocess.Popen(  # another run of the harness, taking its domain's lock as soon as it is released
        [sys.executable, "-c", f"import fcntl, time; f = open({str(lock)!r}, 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        os.close(held.pop(picks[1]))
        assert other.stdout is not None and other.stdout.readline().strip() == "held"
        os.close(held.pop(picks[0]))
        os.close(held.pop(picks[2]))
        assert harness.reserve_domain() == picks[2]
        with pytest.raises(AssertionError, match="no free ROS domain"):
            harness.reserve_domain()  # the one left is this process's own last
    finally:
        bound.close()
        other.kill()
        other.wait()
        for fd in [*held.values(), *(fd for _, fd in harness._held)]:
            os.close(fd)
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when its holder ended
    finally:
        os.close(fd)


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")
def test_shm_leaves_out_the_port_files_of_domains_the_harness_never_uses() -> None:
    """A user's ROS 2 process on domain 0 that ends during a test leaves ``fastdds_port7411`` and its
    ``sem.fastdds_port7411_mutex`` behind, held by nobody: not the test's."""
    tag = uuid.uuid4().hex[:8]
    ours = harness._domain_ports(harness.DOMAINS[0])[11]
    names = [f"sac-edge-{tag}_port7411", f"sem.sac-edge-{tag}_port7411_mutex", f"sac-edge-{tag}_port{ours}"]
    for name in names:
        (SHM / name).write_bytes(b"\0")
    try:
        assert harness.shm() & set(names) == {names[2]}
    finally:
        for name in names:
            (SHM / name).unlink()
