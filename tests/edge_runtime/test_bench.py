"""sac-edge bench rows, JSON file, plot; and --backend auto's choice."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.bundle_format import FP32
from sac_edge.edge_runtime.backends.autoselect import autoselect
from sac_edge.edge_runtime.backends.base import BackendOptions
from sac_edge.edge_runtime.backends.registry import Candidate
from sac_edge.edge_runtime.bench import skipped_line
from sac_edge.edge_runtime.cli import main


@pytest.mark.torch
def test_bench_table_json_and_plot(pendulum_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = main(
        [
            "bench",
            str(pendulum_bundle),
            "--backends",
            "onnxruntime,torch",
            "--batch",
            "1,4",
            "--calls",
            "60",
            "--warmup",
            "5",
            "--out",
            str(out),
            "--plot",
            str(png),
            "--json",
        ]
    )
    assert rc == 0
    stdout, stderr = capsys.readouterr()
    summary = json.loads(stdout.strip().splitlines()[-1])
    # what does not exist here is one line, not one per backend x precision
    assert [line for line in stderr.splitlines() if "skipping" in line] == [
        "bench: skipping onnxruntime/fp16, torch/fp16, torch/int8 (not in the bundle)"
    ], stderr
    assert "mJ/inf" in stdout
    rows = summary["rows"]
    assert {(r["backend"], r["precision"], r["batch"]) for r in rows} == {
        ("onnxruntime", "fp32", 1),
        ("onnxruntime", "fp32", 4),
        ("onnxruntime", "int8", 1),
        ("onnxruntime", "int8", 4),
        ("torch", "fp32", 1),
        ("torch", "fp32", 4),
    }
    for r in rows:
        assert r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["max"]
        assert r["throughput_per_s"] > 0 and r["peak_rss_mb"] > 0
        assert r["energy"] == ("measured" if summary["power_measured"] else "estimated")
        assert r["energy_mj_per_inference"] is None or r["energy_mj_per_inference"] >= 0
    assert json.loads(out.read_text())["rows"] == rows
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_plot_without_matplotlib_is_a_one_line_error(
    pendulum_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # what `import matplotlib` sees without it
    assert main(["bench", str(pendulum_bundle), "--plot", str(tmp_path / "b.png"), "--calls", "5"]) == 2
    assert "pip install matplotlib" in capsys.readouterr().err


def test_auto_picks_the_lowest_p99_among_gated_candidates(rejected_bundle: Path) -> None:
    lines: list[str] = []
    chosen, measured = autoselect(open_bundle(rejected_bundle), BackendOptions(), calls=50, warmup=5, log=lines.append)
    timed = [m for m in measured if m.refusal is None]
    assert {(m.backend, m.precision) for m in timed} == {("onnxruntime", "fp32")}  # int8 rejected, torch excluded
    assert (chosen.name, chosen.precision) == ("onnxruntime", "fp32")
    assert chosen.act(__import__("numpy").zeros(3, "float32")).shape == (1,)
    assert any("int8" in line and "rejected" in line for line in lines)
    assert lines[-1].startswith("auto: chose onnxruntime/fp32 (p99 ")
    # every start printed a line per candidate (7 on a CPU-only machine): now the findings and the choice,
    # what does not exist here named in the choice's line
    assert len(lines) == 1 + sum(m.refusal is not None and "rejected" in m.refusal for m in measured), lines
    absent = {m.backend for m in measured if m.refusal is not None and "unavailable" in m.refusal}
    assert all(name in lines[-1].split("not here: ")[1] for name in absent), lines[-1]
    best = min(timed, key=lambda m: m.p99_us or 0.0)
    assert best.backend == chosen.name and best.precision == chosen.precision


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib (the device install)")
@pytest.mark.parametrize(
    ("measured", "source", "panels"), [(True, "ina3221-hwmon", 2), (False, "estimate:generic-host", 1)]
)
def test_the_plot_draws_power_only_where_a_sensor_measured_it(
    tmp_path: Path, measured: bool, source: str, panels: int
) -> None:
    """The power half was flat ESTIMATED 18 W lines (a model of the whole machine's load): an estimate is left
    out and the title says so; a measured one gets its panel, named by its source."""
    import struct

    import numpy as np

    from sac_edge.edge_runtime.bench import plot

    rng = np.random.default_rng(0)
    samples = {"onnxruntime/fp32/b1": rng.uniform(50, 80, 200), "onnxruntime/int8/b1": rng.uniform(40, 70, 200)}
    power = [(100.0 + t / 10, 5.0 + t / 100, label) for label in samples for t in range(20)]
    png = tmp_path / "bench.png"
    plot(samples, power, png, measured, source)
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG's IHDR
    assert (width, height) == (900, 360 * panels + (45 if panels == 1 else 0))


def test_what_is_not_here_is_one_line() -> None:
    """``sac-edge bench`` printed six "skipping" lines per run on a machine without TensorRT or CUDA."""
    skipped = [
        Candidate(
            "tensorrt", FP32, "backend 'tensorrt' is unavailable: the Python package 'tensorrt' is not installed"
        ),
        Candidate(
            "tensorrt", "fp16", "backend 'tensorrt' is unavailable: the Python package 'tensorrt' is not installed"
        ),
        Candidate("onnxruntime-cuda", FP32, "backend 'onnxruntime-cuda' is unavailable: no CUDAExecutionProvider"),
        Candidate("onnxruntime", "fp16", "precision fp16 is not in the bundle for backend 'onnxruntime'"),
        Candidate("torch", "int8", "precision int8 is not in the bundle for backend 'torch'"),
    ]
    assert skipped_line(skipped) == (
        "bench: skipping tensorrt, onnxruntime-cuda (not installed here: sac-edge doctor says why); "
        "onnxruntime/fp16, torch/int8 (not in the bundle)"
    )
    assert skipped_line(skipped[:1]) == "bench: skipping tensorrt (not installed here: sac-edge doctor says why)"
