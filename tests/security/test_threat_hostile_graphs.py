"""The policy graph is code the runtime executes: a bundle (re-hashed by whoever could write it) may carry a
graph that never returns, runs a foreign kernel, or fails inside on every call.

- Every graph of a bundle is checked when the bundle opens: ops only from the TensorRT 8.5 set sac-export
  writes, subgraphs included, no custom domain, and none the manifest's ``onnx.ops`` does not list; a
  refusal is one line, exit 2, before any step.
- An inference that raises holds the last safe action and is counted; ``--max-backend-errors`` of them
  end the run with the summary (exit 1, one line, not onnxruntime's own log lines).
- An inference that does not return is the watchdog's: past ``--inference-timeout`` the env gets the last
  safe action and the run ends with its summary (exit 1), although the control thread is still inside
  the call.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile_graphs import endless_loop, failing_reshape, foreign_op, long_chain, matmul_policy, ops_of, plant

from sac_edge.edge_runtime import cli as edge_cli

RUN = ["--env", "Pendulum-v1", "--backend", "onnxruntime", "--rate-hz", "200", "--duration", "0.5"]


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        (endless_loop, "uses ops outside the TensorRT 8.5 set sac-export allows (Loop)"),
        (foreign_op, "uses ops outside the TensorRT 8.5 set sac-export allows (ai.evil:Exfiltrate)"),
    ],
)
def test_a_graph_with_ops_outside_the_allow_list_is_refused_when_the_bundle_opens(
    bundle: Path, tmp_path: Path, refused: Callable[..., str], graph: Callable[[], bytes], message: str
) -> None:
    plant(bundle, graph())
    t0 = time.monotonic()
    err = refused(edge_cli.main, ["run", str(bundle), *RUN, "--telemetry", str(tmp_path / "t.jsonl")])
    assert message in err and "re-export the bundle" in err
    assert not (tmp_path / "t.jsonl").exists()  # refused before the loop was set up
    assert time.monotonic() - t0 < 60  # not the endless inference (generous: a loaded 2-core machine)


def test_a_graph_whose_ops_the_manifest_does_not_list_is_refused(bundle: Path, refused: Callable[..., str]) -> None:
    listed = ops_of(bundle / "policy.onnx")  # what sac-export writes into manifest["onnx"]["ops"]
    assert "MatMul" not in listed
    plant(bundle, matmul_policy(), listed_ops=listed)
    assert "uses ops the manifest does not list for it (MatMul)" in refused(edge_cli.main, ["run", str(bundle), *RUN])


def test_the_genuine_graph_matches_its_listed_ops(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plant(bundle, (bundle / "policy.onnx").read_bytes(), listed_ops=ops_of(bundle / "policy.onnx"))
    assert edge_cli.main(["run", str(bundle), *RUN, "--duration", "0.1"]) == 0, capsys.readouterr().err


def test_a_failing_inference_holds_the_safe_action_and_ends_the_run_after_the_limit(
    bundle: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    plant(bundle, failing_reshape())
    telemetry = tmp_path / "t.jsonl"
    argv = ["run", str(bundle), *RUN, "--duration", "0", "--max-backend-errors", "5", "--json", "--telemetry"]
    rc = edge_cli.main([*argv, str(telemetry)])
    out, err = capfd.readouterr()  # what reaches the process's stderr, onnxruntime's own logger included
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert "backend error x5: RuntimeError:" in err and "Reshape" in err and "the summary above" in err
    summary = json.loads(out.strip().splitlines()[-1])
    # each failed call held the last safe action for its step, and the fifth ended the run
    assert summary["backend_errors"] == 5 == summary["steps"] and summary["safe_action_sent"] is True
    assert summary["backend_error"]["type"] == "RuntimeError" and summary["action_clipped"] == 0
    record = json.loads(telemetry.read_text().splitlines()[-1])
    assert record["type"] == "summary" and record["backend_errors"] == 5


def test_an_inference_that_does_not_return_ends_the_run_with_its_summary(bundle: Path, tmp_path: Path) -> None:
    plant(bundle, long_chain())
    telemetry = tmp_path / "t.jsonl"
    argv = ["run", str(bundle), *RUN, "--duration", "0", "--inference-timeout", "1", "--json"]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sac_edge.edge_runtime.cli", *argv, "--telemetry", str(telemetry)],
        capture_output=True,
        text=True,
        timeout=300,  # the call itself runs for minutes; the watchdog ends the run after about a second
    )
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "inference watchdog: a onnxruntime call ran" in err and "--inference-timeout" in err
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["stopped_by"].startswith("inference watchdog") and "sac-edge run" in done.stdout
    assert summary["safe_action_sent"] is True  # sent from the watchdog's thread
    hang = summary["inference_hang"]
    assert hang["backend"] == "onnxruntime" and hang["limit_s"] == 1 and hang["call_s"] >= 1
    record = json.loads(telemetry.read_text().splitlines()[-1])
    assert record["type"] == "summary" and record["inference_hang"] == hang
    assert time.monotonic() - t0 < 240
