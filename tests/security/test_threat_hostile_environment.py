"""Finding 7: the environment is foreign code; the loop survives it.

An exception from ``step()``/``reset()`` (even ``SystemExit`` or ``KeyboardInterrupt``) ends the run with
the summary printed and written to the telemetry, then one stderr line (exit 1; 130 for an interrupt). A
wrong-shaped or wrong-typed observation is an observation fault (counted, handled by ``--obs-fault``),
never broadcast, never a crash.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from sac_edge.edge_runtime import cli as edge_cli


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


def _run(bundle: Path, tmp_path: Path, env: str, *extra: str) -> list[str]:
    return [
        "run", str(bundle), "--env", f"hostile_envs:{env}", "--backend", "onnxruntime", "--rate-hz", "500",
        "--duration", "0.5", "--telemetry", str(tmp_path / "t.jsonl"), "--json", *extra,
    ]  # fmt: skip


def _summary_record(tmp_path: Path) -> dict[str, Any]:
    records = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert records[-1]["type"] == "summary"
    return records[-1]


@pytest.mark.parametrize(
    ("env", "code", "message"),
    [
        ("StepRaises", 1, "environment error in step(): RuntimeError: motor driver lost"),
        ("StepExits", 1, "environment error in step(): SystemExit"),
        ("ResetRaises", 1, "environment error in reset(): OSError: camera not found"),
        ("StepInterrupts", 130, "interrupted"),
    ],
)
def test_env_exception_still_prints_and_writes_the_summary(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: str, code: int, message: str
) -> None:
    rc = edge_cli.main(_run(bundle, tmp_path, env))
    out, err = capsys.readouterr()
    assert rc == code, err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert "sac-edge run" in out and summary["env_error"] is not None
    assert summary["steps"] == (0 if env == "ResetRaises" else 20)
    assert _summary_record(tmp_path)["stopped_by"] == summary["stopped_by"]


@pytest.mark.parametrize("policy", ["clip", "hold"])
def test_wrong_shaped_or_typed_observations_are_counted_faults(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    assert edge_cli.main(_run(bundle, tmp_path, "BadShapes", "--obs-fault", policy)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = summary["steps"]
    assert steps > 100 and summary["obs_malformed"] >= steps * 0.4
    assert summary["action_nonfinite"] == 0
    assert summary["obs_held"] == (summary["obs_malformed"] if policy == "hold" else 0)


@pytest.mark.parametrize("verbose", [False, True])
def test_library_warnings_reach_stderr_only_with_verbose(bundle: Path, tmp_path: Path, verbose: bool) -> None:
    with warnings.catch_warnings(record=True) as seen:  # what would be printed to stderr outside pytest
        warnings.simplefilter("always")
        assert edge_cli.main(_run(bundle, tmp_path, "Noisy", *(["--verbose"] if verbose else []))) == 0
    assert any("deprecated call in the driver library" in str(w.message) for w in seen) == verbose
