"""The environment is foreign code; the loop survives it.

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


@pytest.mark.parametrize("policy", ["clip", "hold"])
def test_masked_array_observations_are_read_with_masked_entries_as_faults(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    assert edge_cli.main(_run(bundle, tmp_path, "MaskedObservations", "--obs-fault", policy)) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # every 4th observation has a masked entry: a non-finite reading, repaired or held per the policy
    assert summary["obs_nonfinite"] >= 1 and summary["obs_malformed"] == 0
    assert summary["obs_held"] == (summary["obs_nonfinite"] if policy == "hold" else 0)
    assert summary["action_nonfinite"] == 0 and summary["stopped_by"] == "duration"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("ArrayFlags", "environment error in step(): TypeError: step() returned terminated as an array of shape (2,)"),
        ("RaisingFlag", "environment error in step(): RuntimeError: truth of a driver status word"),
    ],
)
def test_an_unreadable_step_result_ends_the_run_with_the_summary(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], env: str, message: str
) -> None:
    rc = edge_cli.main(_run(bundle, tmp_path, env))
    out, err = capsys.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1 and message in err, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 20  # one-element flags were read; the first bad result ended the run
    assert _summary_record(tmp_path)["env_error"]["call"] == "step"


def test_a_raising_close_after_a_complete_run_keeps_the_summary(
    bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = edge_cli.main(_run(bundle, tmp_path, "CloseRaises"))
    out, err = capsys.readouterr()
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "environment error in close(): OSError: actuator did not park" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["stopped_by"] == "duration" and summary["env_error"]["call"] == "close"
    assert _summary_record(tmp_path)["env_error"]["call"] == "close"


def test_a_missing_reward_under_finetune_is_counted_not_learned(
    clean_finetune_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    bundle = Path(shutil.copytree(clean_finetune_bundle, tmp_path / "ft"))
    fast = ["--learning-starts", "200", "--swap-every", "20", "--finetune-buffer", "2000", "--finetune-batch", "32"]
    argv = [*_run(bundle, tmp_path, "NoReward"), "--finetune", *fast]
    argv[argv.index("--rate-hz") + 1] = "1000"
    assert edge_cli.main(argv) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["reward_invalid"] > 0
    # every step is either learned from or counted (a held/malformed observation is neither: none here); a
    # transition pushed while the learner drains the ring is dropped rather than waited for, and counted too
    ft = summary["finetune"]
    assert ft["steps_collected"] + ft["dropped"] + summary["reward_invalid"] == summary["steps"], ft
