import os

import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.control.realtime import enter_realtime


def test_off_by_default_changes_nothing():
    before = os.sched_getscheduler(0)
    assert enter_realtime(0) == []
    assert os.sched_getscheduler(0) == before


def test_pinning_and_bad_cpus():
    here = sorted(os.sched_getaffinity(0))
    try:
        assert enter_realtime(0, [here[0]]) == [f"pinned to CPUs [{here[0]}]"]
        assert os.sched_getaffinity(0) == {here[0]}
        with pytest.raises(SacEdgeError, match="name CPUs that exist"):
            enter_realtime(0, [4096])
    finally:
        os.sched_setaffinity(0, set(here))


def test_priority_out_of_range_is_one_line():
    with pytest.raises(SacEdgeError, match="out of range"):
        enter_realtime(150)


def test_idle_latency_request_is_written_and_held_for_the_block(tmp_path):
    import struct

    from sac_edge.edge_runtime.control.realtime import hold_idle_latency

    device = tmp_path / "cpu_dma_latency"  # the PM QoS file takes a binary s32
    device.write_bytes(b"")
    with hold_idle_latency(20, device) as line:
        assert struct.unpack("i", device.read_bytes()) == (20,) and "20 us" in line
    with pytest.raises(SacEdgeError, match="negative"):
        hold_idle_latency(-1, device).__enter__()
    with pytest.raises(SacEdgeError, match="drop --idle-latency-us"):
        hold_idle_latency(0, tmp_path / "absent").__enter__()
