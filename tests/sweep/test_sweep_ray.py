"""sac-sweep end to end on an embedded local Ray: a 2 x 2 sweep whose run dirs export, its resume, and a
crashing trial that does not stop the others. Each sweep starts and stops its own Ray (about 10 s), so the
crashing trial shares the storage test's second sweep."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")
import ray
from docs_tables import documented

from sac_edge.export.cli import main as export_main
from sac_edge.sweep.cli import main

HERE = Path(__file__).resolve().parent
TINY = [
    "--total-steps", "1000", "--learning-starts", "400", "--eval-every", "500", "--eval-episodes", "1",
    "--hidden", "16,16", "--batch-size", "32", "--cpus", "2", "--json",
]  # fmt: skip


def _last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_tiny_sweep_run_dirs_export_and_resume_reruns_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    cost = ["--target-return", "-1000000000", "--price-per-hour", "3.6"]  # a target every evaluation reaches
    assert main(["--out", str(out), "--seeds", "2", "--grid", "actor_lr=1e-3,3e-4", *cost, *TINY]) == 0
    result = _last_json(capsys)
    for c in result["configs"]:  # each trial's clock, read from its run dir
        assert c["wall_s"] > 0 and c["cost_usd"] == pytest.approx(c["wall_s"] / 1000) and c["reached_target"] == 2
        assert 0 < c["time_to_target_s"] <= c["wall_s"]
    assert not ray.is_initialized()  # the embedded Ray was shut down
    assert result["engine"] == "ray" and result["ray_version"] == ray.__version__
    assert (result["trials"], result["completed"], result["errors"]) == (4, 4, 0)
    assert [c["config"] for c in result["configs"]] and {c["completed"] for c in result["configs"]} == {2}
    assert result["best"]["run"] in {c["best_run"] for c in result["configs"]}
    assert {p.name for p in out.iterdir()} == documented("Sweep dir")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["configs"] == result["configs"] and (out / "curves.png").stat().st_size > 0
    runs = sorted((out / "trials").iterdir())
    assert [r.name for r in runs] == [f"actor_lr={lr}-seed{s}" for lr in ("1e-3", "3e-4") for s in (0, 1)]
    for run in runs:  # ordinary run dirs: sac-train's files, the grid value in the saved config
        config = json.loads((run / "config.json").read_text())
        assert config["actor_lr"] == (1e-3 if "1e-3" in run.name else 3e-4) and config["seed"] == int(run.name[-1])
        # --threads 0 (the default) runs each trial on its one-CPU share: no probe, no oversubscription
        assert config["threads"] == 1 and config["choices"]["threads"]["mode"] == "forced"
        assert export_main([str(run), "--out", str(tmp_path / "bundles" / run.name)]) == 0
        assert (tmp_path / "bundles" / run.name / "policy.onnx").is_file()
    capsys.readouterr()

    before = {r.name: (r / "metrics.csv").stat().st_mtime_ns for r in runs}
    assert main(["--out", str(out), "--resume", "--cpus", "2", "--json"]) == 0
    assert _last_json(capsys)["configs"] == result["configs"]
    assert {r.name: (r / "metrics.csv").stat().st_mtime_ns for r in runs} == before


def test_storage_holds_one_checkpoint_per_trial_force_clears_it_and_a_crash_spares_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))  # the Ray workers import the env from here
    out, store = tmp_path / "sweep", tmp_path / "store"
    tiny = [*TINY[TINY.index("--learning-starts") :], "--total-steps", "500", "--storage", str(store)]
    assert main(["--out", str(out), "--grid", "actor_lr=1e-3", "--seeds", "1", *tiny]) == 0
    assert [p.parent.name.partition("@")[0] for p in store.glob("sweep/*/checkpoint_*")] == ["actor_lr=1e-3-seed0"]
    capsys.readouterr()
    assert main(["--out", str(tmp_path / "other"), "--name", "sweep", "--seeds", "1", *tiny]) == 2  # its name's
    assert "already holds a sweep named sweep" in capsys.readouterr().err

    # --force clears the storage for a sweep whose odd seed's simulator crashes (at step 301, before its
    # first checkpoint): the crash is reported and the other trial finishes
    crashing = ["--env", "sweep_toy_envs:CrashOnOddSeed", "--seeds", "2"]
    assert main(["--out", str(out), "--force", *crashing, *tiny]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert (result["trials"], result["completed"], result["errors"]) == (2, 1, 1)
    assert "trial default-seed1 failed: RuntimeError: simulator lost contact (test crash)" in captured.err
    failed = [r for r in json.loads((out / "summary.json").read_text())["trial_results"] if r["status"] == "error"]
    assert [Path(r["run"]).name for r in failed] == ["default-seed1"]
    assert result["best"]["run"].endswith("default-seed0") and result["configs"][0]["per_seed"]["1"] is None
    assert [p.parent.name.partition("@")[0] for p in store.glob("sweep/*/checkpoint_*")] == ["default-seed0"]
    assert [p.name for p in (out / "trials").iterdir()] == ["default-seed0"]


def test_an_address_where_nothing_answers_is_one_line_at_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ray 2.60's ``ray.init`` retried a closed port or an unknown host for minutes without a word (over 300 s
    here for 127.0.0.1:PORT)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # Ray lets it override --address
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    for address, why in ((f"127.0.0.1:{port}", "Connection refused"), ("no-such-head.invalid:6379", "")):
        start = time.monotonic()  # 3 s each here; the bound leaves room for a busy machine and a slow DNS resolver
        assert main(["--address", address, "--out", str(tmp_path / "out"), *TINY]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"nothing answers at {address}" in err and why in err, err
        assert "ray start --head" in err and time.monotonic() - start < 90, err
    assert not (tmp_path / "out").exists()


def test_ray_client_addresses_are_refused_with_the_alternatives(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--address", "ray://head:10001", "--out", "unused", *TINY]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--address auto" in err and "ray job submit" in err, err
    assert not Path("unused").exists()
