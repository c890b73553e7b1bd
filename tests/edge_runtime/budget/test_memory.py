"""Memory readers on the Xavier NX fixture /proc and debugfs, and on this live process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sac_edge.edge_runtime.budget.memory import (
    NVMAP_MAPS,
    MemoryProbe,
    parse_nvmap_maps,
    read_nvmap,
    read_process_memory,
    read_system_memory,
)
from sac_edge.edge_runtime.budget.sensors import SensorError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PID = 4242


def jp5(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "xavier_nx_jp5", tmp_path / "jp5"))


def test_process_rss_and_peak_from_status(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    memory = read_process_memory(PID, root)
    assert (memory.rss_mb, memory.peak_rss_mb) == (170.0, 192.0)
    status = root / f"proc/{PID}/status"
    status.write_text(status.read_text().replace("VmRSS:\t  174080 kB", "VmRSS:\t  215040 kB"))
    assert read_process_memory(PID, root).rss_mb == 210.0
    assert read_process_memory(PID, root).peak_rss_mb == 210.0  # never below the current reading
    with pytest.raises(SensorError, match="cannot read"):
        read_process_memory(1, root)


def test_this_process_on_the_real_proc() -> None:
    memory = read_process_memory()
    assert 10 < memory.rss_mb <= memory.peak_rss_mb


def test_jetson_unified_memory_from_meminfo(tmp_path: Path) -> None:
    system = read_system_memory(jp5(tmp_path))
    assert (system.total_mb, system.available_mb, system.nvmap_used_mb) == (7772.0, 3360.0, 904.0)
    assert system.used_mb == 4412.0  # what tegrastats calls RAM used on this board
    assert read_system_memory().total_mb > read_system_memory().available_mb > 0  # the real /proc/meminfo


def test_nvmap_maps_table(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    table = read_nvmap(root)
    assert table is not None
    assert [(c.process, c.pid, c.size_kb) for c in table.clients] == [
        ("python3", 4242, 24576),
        ("Xorg", 2651, 17876),
        ("gnome-shell", 8119, 2900),
        ("python3", 4242, 1024),
    ]
    assert table.pid_kb(4242) == 25600 and table.total_kb == 49276
    (root / NVMAP_MAPS).unlink()
    assert read_nvmap(root) is None  # not a Jetson, or not root


def test_iovmm_clients_form_from_a_public_dump() -> None:
    # the iovmm/clients listing quoted in htop's NVIDIA Jetson patch notes (same client/total lines)
    text = """CLIENT                        PROCESS      PID        SIZE
user                         gpu_burn     7979   23525644K
user                      gnome_shell     8119       5800K
user                             Xorg     2651      17876K
total                                            23549320K
"""
    table = parse_nvmap_maps(text)
    assert table.pid_kb(7979) == 23525644 and table.total_kb == 23549320 and len(table.clients) == 3


def test_probe_budget_figure_prefers_nvmap_then_cuda(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    probe = MemoryProbe(root, pid=PID, cuda=lambda: (64 * 2**20, 96 * 2**20), clock=lambda: 5.0)
    sample = probe.read()
    assert sample.nvmap_process_mb == 25.0 and sample.cuda_reserved_mb == 96.0 and sample.cuda_allocated_mb == 64.0
    assert sample.budget_mb == 170.0 + 25.0
    record = json.loads(json.dumps(sample.to_dict()))
    assert record["budget_mb"] == 195.0 and record["system"]["nvmap_used_mb"] == 904.0 and record["timestamp"] == 5.0

    (root / NVMAP_MAPS).unlink()
    assert MemoryProbe(root, pid=PID, cuda=lambda: (0, 96 * 2**20)).read().budget_mb == 170.0 + 96.0
    assert MemoryProbe(root, pid=PID).read().budget_mb == 170.0


def test_probe_counts_a_followed_process_until_it_exits(tmp_path: Path) -> None:
    root = jp5(tmp_path)
    shutil.copytree(root / "proc" / str(PID), root / "proc" / "2651")
    probe = MemoryProbe(root, pid=PID)
    alone = probe.read()
    probe.follow(2651)  # e.g. the fine-tuning learner process
    both = probe.read()
    assert both.rss_mb == 2 * alone.rss_mb and both.peak_rss_mb == 2 * alone.peak_rss_mb
    assert both.nvmap_process_mb == alone.nvmap_process_mb + 17876 / 1024  # its NvMap client in the fixture
    shutil.rmtree(root / "proc" / "2651")
    assert probe.read().rss_mb == alone.rss_mb
