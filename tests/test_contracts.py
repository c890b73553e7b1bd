"""docs/CONTRACTS.md and docs/CLI.md held to the code: the real commands train, export, run, benchmark and
diagnose a small policy, and every file, manifest key and ``--json`` key they produce is documented, and
everything documented is produced (a few entries only appear with hardware or flags this run cannot use)."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from docs_tables import documented, documented_rows

from sac_edge.common.bundle_format import ENGINES_DIR, FINETUNE_DIR, MANIFEST
from sac_edge.common.manifest import read_manifest
from sac_edge.sweep.cli import JSON_KEYS

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
#: documented, but produced only with a GPU (engines) or a flag this run does not give
NEEDS_TENSORRT = {"policy.<precision>.plan"}
NEEDS_FINETUNE = {"finetune"}
NEEDS_PROFILE = {"profile"}
#: metrics.csv columns a CPU run without NVML leaves empty in every row
NEEDS_CUDA = {"cuda_max_allocated_mb", "cuda_max_reserved_mb", "gpu_util_pct", "gpu_power_w"}


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON (jq, JavaScript and Go reject it): a missing figure is null")


def strict(text: str) -> Any:
    """``json.loads`` as strict parsers read: NaN, Infinity and -Infinity refused."""
    return json.loads(text, parse_constant=_refuse)


def _json(cmd: list[str], tmp_path: Path) -> dict:
    """The command's ``--json`` line; every line of its stdout that is JSON is strict JSON."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [strict(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return lines[-1]


def _all_strict(folder: Path) -> int:
    """Every JSON and JSON-lines file under ``folder`` parsed strictly; how many there were."""
    files = [p for p in folder.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file()]
    for path in files:
        text = path.read_text()
        for doc in text.splitlines() if path.suffix == ".jsonl" else [text]:
            try:
                strict(doc)
            except AssertionError as err:
                raise AssertionError(f"{path}: {err}") from None
    return len(files)


def _both_ways(produced: set[str], heading: str, absent_here: set[str] = frozenset()) -> None:
    docs = documented(heading)
    assert produced - docs == set(), f"produced but not in docs/CONTRACTS.md {heading!r}"
    assert docs - absent_here - produced == set(), f"in docs/CONTRACTS.md {heading!r} but not produced"


def test_cli_reference_is_current() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], check=False)
    assert proc.returncode == 0, "docs/CLI.md differs from the config classes: run make docs"


def _config_documented(saved: dict, heading: str) -> None:
    """``saved`` (a ``config_dict``) has the keys the table under ``heading`` names, and each section's row
    names exactly that section's keys."""
    rows = documented_rows(heading)
    _both_ways(set(saved), heading)
    for name, value in saved.items():
        if isinstance(value, dict):
            assert set(re.findall(r"`([^`]+)`", rows[name])) == set(value), f"{heading}: {name}'s keys"


def test_run_config_keys_documented() -> None:
    from sac_edge.common.config import config_dict
    from sac_edge.edge_runtime.config import RunConfig

    _config_documented(config_dict(RunConfig(bundle="b")), "sac-edge run config")


def test_metrics_columns_documented() -> None:
    from sac_edge.train.metrics import COLUMNS

    _both_ways(set(COLUMNS), "metrics.csv")


def _metrics_keep_the_contract(run: Path) -> None:
    """The header is the documented columns; every column the run can measure here is filled in some row
    (and the monitoring ones in every row), and the CUDA/NVML ones stay empty on a CPU."""
    with open(run / "metrics.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        _both_ways(set(reader.fieldnames or ()), "metrics.csv")
        rows = list(reader)
    filled = {k for row in rows for k, v in row.items() if v != ""}
    assert filled == documented("metrics.csv") - NEEDS_CUDA, "metrics.csv columns measured on a CPU"
    for column in ("steps_per_s", "rss_mb", "peak_rss_mb", "cpu_util_pct", "eta_s", "wall_s"):
        assert all(float(row[column]) >= 0 for row in rows), column


def test_sweep_json_keys_documented() -> None:
    _both_ways(set(JSON_KEYS), "sac-sweep --json")


@pytest.mark.slow
def test_train_export_run_bench_doctor_keep_the_contracts(tmp_path: Path) -> None:
    run, bundle, key = tmp_path / "run", tmp_path / "bundle", tmp_path / "key"
    train = _json([
        str(BIN / "sac-train"), "--env", "Pendulum-v1", "--total-steps", "400", "--learning-starts", "300",
        "--batch-size", "64", "--hidden", "64,64", "--eval-every", "200", "--eval-episodes", "1",
        "--no-progress", "--out", str(run), "--json",
    ], tmp_path)  # fmt: skip
    _both_ways(set(train), "sac-train --json")
    _both_ways({p.name for p in run.iterdir()}, "Run dir", NEEDS_PROFILE)
    _metrics_keep_the_contract(run)

    subprocess.run([str(BIN / "sac-edge"), "keygen", str(key)], check=True, capture_output=True, timeout=60)
    export = _json([
        str(BIN / "sac-export"), str(run), "--out", str(bundle), "--fp16", "--int8", "--calib-samples", "256",
        "--gate-episodes", "2", "--sign-key", str(key), "--layout", str(ROOT / "docs/examples/pendulum.layout.json"),
        "--json",
    ], tmp_path)  # fmt: skip
    assert export["bundle"] == str(bundle) and export["parity_max_abs"] <= 1e-5
    _both_ways(set(export), "sac-export --json")
    _both_ways({p.name for p in bundle.iterdir()}, "Bundle", NEEDS_TENSORRT)
    manifest = read_manifest(bundle)
    _both_ways(set(manifest), MANIFEST)
    assert set(manifest["files"]) == {p.name for p in bundle.iterdir()} - {MANIFEST, "manifest.sig"}
    assert manifest["source"]["path"] == str(run.resolve())
    obs = np.load(run / "calib_states.npy")[:32]
    for name in ("policy.onnx", "policy.fp16.onnx", "policy.int8.onnx", "policy.int8-cpu.onnx"):
        sess = ort.InferenceSession(str(bundle / name), providers=["CPUExecutionProvider"])
        action = sess.run(["action"], {"obs": obs})[0]
        assert action.shape == (32, 1) and np.all(np.abs(action) <= 2.0 + 1e-5)

    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "key.pub").write_bytes((tmp_path / "key.pub").read_bytes())
    summary = _json([
        str(BIN / "sac-edge"), "run", str(bundle), "--duration", "0.5", "--rate-hz", "100",
        "--trusted-keys", str(trusted), "--telemetry", str(tmp_path / "t.jsonl"), "--json",
    ], tmp_path)  # fmt: skip
    _both_ways(set(summary), "sac-edge run --json", NEEDS_FINETUNE)
    record = strict((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert record["type"] == "config" and record["config"]["loop"]["rate_hz"] == 100
    _config_documented(record["config"], "sac-edge run config")
    slots = summary["steps"] + summary["skipped_slots"]  # 50 scheduled; a late last step may skip past the end
    assert 50 <= slots <= max(50, int(summary["duration_s"] * 100) + 1) and summary["stopped_by"] == "duration"
    device_dirs = documented("Written on the device")
    assert device_dirs == {ENGINES_DIR, FINETUNE_DIR}
    assert {p.name for p in bundle.iterdir() if p.is_dir()} <= device_dirs

    bench = _json([
        str(BIN / "sac-edge"), "bench", str(bundle), "--batch", "1", "--calls", "20", "--warmup", "5", "--json",
        "--out", str(tmp_path / "bench.json"),
    ], tmp_path)  # fmt: skip
    _both_ways(set(bench), "sac-edge bench --json")
    doctor = _json([str(BIN / "sac-edge"), "doctor", str(bundle), "--json"], tmp_path)
    _both_ways(set(doctor), "sac-edge doctor --json")
    assert _all_strict(tmp_path) >= 6  # the run dir's, the bundle's, the telemetry, bench.json
