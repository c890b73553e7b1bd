"""Malformed and hostile inputs that an unlucky user or an attacker hands the commands: wrong types in the
files a bundle or run dir carries, values no run can use, and flag values so large they were found only
after the slow work (or never: a benchmark that never ends, a learner that fails to allocate after minutes).
Each is exit 2 with one line naming the problem and the fix, before slow work; the docstring of each case
list says what each did on d879073.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sac_edge.common.bundle import open_bundle
from sac_edge.common.config import config_dict
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime import bench, compose, drill, preflight
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime import run as edge_run
from sac_edge.edge_runtime.runtime import Runtime, RuntimeOptions
from sac_edge.export import cli as export_cli
from sac_edge.export import source as export_source
from sac_edge.sweep import cli as sweep_cli
from sac_edge.train import cli as train_cli
from sac_edge.train.config import TrainConfig


def _no_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a backend (the first slow step) fails the test: the input must be refused before it."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a backend was opened before the input was checked")

    monkeypatch.setattr(compose, "open_backends", refuse)
    monkeypatch.setattr(bench, "open_backend", refuse)


def _edit_spec(bundle: Path, **fields: Any) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["spec"].update(fields)
    (bundle / "manifest.json").write_text(json.dumps(manifest))  # Python writes NaN as NaN, which it reads back


#: Bundle manifests with the wrong types or impossible values in their spec. On d879073 each ran (exit 0):
#: "3" and 3.7 were converted to sizes, "32" read as hidden sizes (3, 2), a NaN or inverted action bound kept.
SPEC_CASES = [
    ({"obs_dim": "3"}, "policy spec is incomplete or malformed (obs_dim is str '3')"),
    ({"obs_dim": 3.7}, "(obs_dim is float '3.7')"),
    ({"act_dim": True}, "(act_dim is bool 'True')"),
    ({"hidden": "32"}, "(hidden is str '32')"),
    ({"env_id": 5}, "(env_id is int '5')"),
    ({"action_low": [float("nan")]}, "an action bound is 'nan', not a finite number"),
    ({"action_high": ["2"]}, "an action bound is '2', not a finite number"),
    ({"action_low": [3.0]}, "each action_low must be below its action_high"),
    ({"action_low": [2.0]}, "each action_low must be below its action_high"),
]


@pytest.mark.parametrize(("fields", "message"), SPEC_CASES)
@pytest.mark.parametrize("command", ["run", "bench", "drill", "doctor"])
def test_a_manifest_spec_of_the_wrong_type_is_one_line(
    bundle: Path,
    refused: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    fields: dict[str, Any],
    message: str,
) -> None:
    _no_backends(monkeypatch)
    _edit_spec(bundle, **fields)
    assert message in refused(edge_cli.main, [command, str(bundle)])


#: Flag values refused only after slow work on d879073, or not at all.
RUN_CASES = [
    # exit 2, but after the bundle, the env and the backends were opened (the loop pinned itself)
    (["--cpus", "999"], "--cpus names CPU 999, which this process may not use; choose from"),
    # exit 2 after the learner process imported torch and failed to allocate (39 s; 208 s for the batch)
    (["--finetune", "--finetune-buffer", "100000000000"], "--finetune-buffer must be at most 10000000 rows"),
    (["--finetune", "--finetune-batch", "100000000"], "--finetune-batch at most 65536 and the buffer"),
    (["--finetune", "--finetune-buffer", "2000", "--finetune-batch", "4000"], "and the buffer, got 2000 and 4000"),
]


@pytest.mark.parametrize(("flags", "message"), RUN_CASES)
def test_a_run_flag_found_late_is_one_line_before_any_backend(
    bundle: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    _no_backends(monkeypatch)
    assert message in refused(edge_cli.main, ["run", str(bundle), *flags])


BENCH_CASES = [
    (
        ["--calls", "100000000000"],
        "--calls must be from 1 and --warmup from 0, both to 10000000",
    ),  # exit 1, MemoryError
    (["--warmup", "100000000000"], "--calls must be from 1 and --warmup from 0, both to 10000000"),  # never ended
    (["--sensor-root", "{tmp}/no-such-dir"], "is not a directory; pass / on the device"),  # exit 0, no power rows
    (["--sensor-root", "{tmp}/file"], "is not a directory; pass / on the device"),  # exit 0, no power rows
]


@pytest.mark.parametrize(("flags", "message"), BENCH_CASES)
def test_a_bench_flag_found_late_is_one_line_before_any_backend(
    bundle: Path,
    tmp_path: Path,
    refused: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    message: str,
) -> None:
    _no_backends(monkeypatch)
    (tmp_path / "file").write_text("not a directory")
    argv = ["bench", str(bundle), *(f.replace("{tmp}", str(tmp_path)) for f in flags)]
    assert message in refused(edge_cli.main, argv)


#: sac-train sizes past what any run allocates or starts. On d879073: --buffer-size and --batch-size exit 1
#: ("internal error", torch's allocator) after 43 s and 66 s; --num-envs and --critic-layers had not started
#: training after 4 minutes; --threads 100000 died of SIGSEGV (exit -11) after a minute.
TRAIN_CASES = [
    (["--buffer-size", "100000000000"], "--buffer-size must be at most 100000000, got 100000000000"),
    (["--batch-size", "100000000000"], "--batch-size must be at most 1048576, got 100000000000"),
    (["--num-envs", "100000"], "--num-envs must be at most 1024, got 100000"),
    (["--critic-layers", "100000"], "--critic-layers must be at most 64, got 100000"),
    (["--threads", "100000"], "(the CPUs this process may use), got 100000"),
]


@pytest.mark.parametrize(("flags", "message"), TRAIN_CASES)
def test_a_train_size_past_any_run_is_one_line(
    tmp_path: Path, refused: Callable[..., str], flags: list[str], message: str
) -> None:
    argv = ["--total-steps", "10", "--out", str(tmp_path / "run"), *flags]
    assert message in refused(train_cli.main, argv, prog="sac-train")
    assert not (tmp_path / "run").exists()


def test_a_sweep_grid_of_such_sizes_is_one_line_before_ray(tmp_path: Path, refused: Callable[..., str]) -> None:
    argv = ["--out", str(tmp_path / "sweep"), "--seeds", "1", "--grid", "buffer_size=1000,100000000000"]
    assert "--grid buffer_size: must be at most 100000000, got 100000000000" in refused(
        sweep_cli.main, argv, prog="sac-sweep"
    )
    assert not (tmp_path / "sweep").exists()


#: A run dir's saved settings of the wrong type, taken by ``sac-train --resume``. On d879073 each was exit 1
#: ("internal error" from torch: ``rand()`` got a str, ``empty()`` got a str size, the allocator failed)
#: after the envs and networks were built; a ``hidden`` that is not a list was a raw TypeError.
RESUME_CASES = [
    ({"batch_size": "16"}, "--batch-size must be an integer, got '16'"),
    ({"hidden": "8,8"}, "--hidden must be"),
    ({"hidden": 8}, "--hidden must be"),
    ({"buffer_size": 100000000000}, "--buffer-size must be at most 100000000"),
    ({"gamma": "0.99"}, "--gamma must be"),
]


@pytest.mark.parametrize(("saved", "message"), RESUME_CASES)
def test_a_saved_setting_of_the_wrong_type_is_one_line_on_resume(
    tmp_path: Path, refused: Callable[..., str], saved: dict[str, Any], message: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    config = {**config_dict(TrainConfig(env="Pendulum-v1", out=str(run))), **saved}
    (run / "config.json").write_text(json.dumps(config))
    (run / "checkpoint.safetensors").write_bytes(b"refused before it is read")
    err = refused(train_cli.main, ["--resume", "--out", str(run), "--total-steps", "10"], prog="sac-train")
    assert f"{run / 'config.json'} holds a setting no run can use ({message}" in err


def test_a_run_dir_whose_config_and_checkpoint_disagree_is_one_line(
    clean_bundle: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    """On d879073: exit 1, "internal error: RuntimeError: Error(s) in loading state_dict for Actor"."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(clean_bundle / "learner.safetensors", run / "checkpoint.safetensors")
    spec = json.loads((clean_bundle / "manifest.json").read_text())["spec"]
    # the checkpoint's networks are 64 wide: wider in config.json, so no tensor is larger than the spec allows
    # (a narrower spec is refused from the header already, test_threat_memory_totals.py) and the shapes decide
    spec["hidden"] = [128, 128]
    (run / "config.json").write_text(json.dumps({"spec": spec, "env": spec["env_id"]}))
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "out")], prog="sac-export")
    assert "checkpoint.safetensors does not fit config.json's spec (hidden=[128, 128]" in err
    assert not (tmp_path / "out").exists()


#: A sweep dir's saved settings of the wrong shape or type. On d879073 each was exit 1: "internal error:
#: KeyError: 'sweep'", "TypeError: '<' not supported between 'str' and 'int'", "'int' object is not iterable".
SWEEP_RESUME_CASES = [
    ({"seeds": 1, "grid": 5}, "holds no 'sweep' and 'train' settings"),
    ({"sweep": {"seeds": "x"}, "train": {}}, "holds a setting no sweep can use (--seeds must be an integer"),
    ({"sweep": {"grid": 5}, "train": {}}, "holds a setting no sweep can use (--grid must be"),
    ({"sweep": {}, "train": {"batch_size": "x"}}, "holds a setting no sweep can use (--batch-size must be"),
]


@pytest.mark.parametrize(("saved", "message"), SWEEP_RESUME_CASES)
def test_a_saved_sweep_setting_of_the_wrong_type_is_one_line_on_resume(
    tmp_path: Path, refused: Callable[..., str], saved: dict[str, Any], message: str
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep_config.json").write_text(json.dumps(saved))
    assert message in refused(sweep_cli.main, ["--out", str(sweep), "--resume"], prog="sac-sweep")


def _no_slow_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the env (seconds for MuJoCo, any time for a user's class) or a backend fails the test."""
    _no_backends(monkeypatch)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the env was made before the input was checked")

    monkeypatch.setattr(edge_run, "make_env", refuse)
    monkeypatch.setattr(drill, "make_env", refuse)


#: Shield flags of the wrong size for the bundle's one action. On bca952e each was refused (exit 2) only once
#: the env was made (``run``: and the fine-tuning lock taken), by the shield's own check.
ACTION_SIZE_CASES = [
    (["--safe-action", "0.1,0.2"], "--safe-action takes 1 numbers (the bundle's act_dim), got 2"),
    (["--slew", "0.1,0.2,0.3"], "--slew takes one value or 1 (the bundle's act_dim), got 3"),
]


@pytest.mark.parametrize(("flags", "message"), ACTION_SIZE_CASES)
@pytest.mark.parametrize("command", ["run", "drill"])
def test_a_shield_flag_of_the_wrong_size_is_one_line_before_the_env(
    bundle: Path,
    refused: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    flags: list[str],
    message: str,
) -> None:
    _no_slow_work(monkeypatch)
    assert message in refused(edge_cli.main, [command, str(bundle), *flags])


#: On bca952e: exit 2, but after the backends were opened and the learner process imported torch (5-7 s here,
#: minutes on a Jetson), from the learner's own sizing.
@pytest.mark.parametrize("budget", ["300", "1"])
def test_a_memory_budget_below_the_learner_is_one_line_before_any_backend(
    bundle: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, budget: str
) -> None:
    _no_slow_work(monkeypatch)
    err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--mem-budget-mb", budget])
    assert f"--mem-budget-mb {budget} cannot hold fine-tuning: its learner process alone needs about 350 MiB" in err
    assert "raise --mem-budget-mb to at least 350 or drop --finetune" in err


def test_a_bundle_the_caller_opened_is_checked_as_the_runtime_would_open_it(
    bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Runtime(options, bundle=...)`` (a loop that opened the bundle itself, as the ROS node does) gets the
    same checks before the lock or a backend: on the first version of this round it skipped them."""
    _no_slow_work(monkeypatch)
    options = RuntimeOptions.of(str(bundle), finetune=True, mem_budget_mb=300)
    with pytest.raises(SacEdgeError, match=r"^--mem-budget-mb 300 cannot hold fine-tuning"):
        Runtime(options, bundle=open_bundle(str(bundle))).open()


def test_the_memory_floor_refuses_only_budgets_below_it() -> None:
    preflight.check_finetune_memory(True, preflight.FINETUNE_FLOOR_MB)
    preflight.check_finetune_memory(False, 1.0)  # no fine-tuning: the governor alone, no learner
    preflight.check_finetune_memory(True, None)


#: Accuracy-gate records of the wrong type. On bca952e each was read as "no verdict" (or a verdict of 5): the
#: damage went unreported, int8 was skipped and the commands went on (exit 0).
GATE_CASES = [
    ("accepted", "the accuracy gate is str 'accepted', not a record"),
    (5, "the accuracy gate is int '5', not a record"),
    ({"verdict": 5}, "the accuracy gate verdict for int8 is int '5', not a word"),
    ({"verdict": "accepted", "float_layers": "actor"}, "float_layers for int8 is str 'actor', not a list"),
    ({"int8": "accepted"}, "the accuracy gate record for int8 is str 'accepted', not a record"),
    ({"int4": {"verdict": "accepted"}}, "the accuracy gate names str 'int4', not one of fp32, fp16, int8"),
]


@pytest.mark.parametrize(("gate", "message"), GATE_CASES)
@pytest.mark.parametrize("command", ["run", "bench", "drill"])
def test_a_gate_of_the_wrong_type_is_one_line(
    bundle: Path,
    refused: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
    gate: object,
    message: str,
) -> None:
    _no_slow_work(monkeypatch)
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps({**manifest, "gate": gate}))
    err = refused(edge_cli.main, [command, str(bundle)])
    assert message in err and err.endswith("re-export the bundle with sac-export")


#: Drill sizes that never end. On bca952e each ran (the env made, the episodes started): 10^9 episodes per fault
#: and mode, or a fault that never starts within --max-steps (a drill that measures nothing, exit 0); a
#: spike or push of 1e308 standard deviations exited 0 with a return of -inf.
DRILL_CASES = [
    (["--episodes", "1000000000"], "--episodes must be at most 1000, got 1000000000"),
    (["--max-steps", "100000000000"], "--max-steps must be at most 1000000, got 100000000000"),
    (["--fault-steps", "100000000000"], "--fault-steps must be at most 1000000"),
    (["--delay-steps", "100000000000"], "--delay-steps must be at most 1000000"),
    (["--max-steps", "5", "--fault-start", "50"], "--fault-start 50 is not below --max-steps 5"),
    (["--spike-sigma", "1e308"], "--spike-sigma must be a positive number of at most 10000, got 1e+308"),
    (["--ood-scale", "1e308"], "--ood-scale must be a positive number of at most 10000, got 1e+308"),
]


@pytest.mark.parametrize(("flags", "message"), DRILL_CASES)
def test_a_drill_that_would_not_end_is_one_line(
    bundle: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    _no_slow_work(monkeypatch)
    assert message in refused(edge_cli.main, ["drill", str(bundle), *flags])


#: sac-export counts past any export. On bca952e the first four ran on past 2 minutes (never ended); the
#: last two exited 0 with a TensorRT profile or workspace no device can build.
EXPORT_CASES = [
    (["--parity-states", "100000000000"], "--parity-states must be at most 1000000"),
    (["--int8", "--calib-samples", "100000000000"], "--calib-samples must be at most 1000000"),
    (["--int8", "--gate-episodes", "100000000000"], "--gate-episodes must be at most 1000"),
    (["--envelope-episodes", "100000000000"], "--envelope-episodes must be at most 1000"),
    (["--max-batch", "100000000000"], "--max-batch must be at most 65536"),
    (["--workspace-mb", "100000000000"], "--workspace-mb must be at most 1048576"),
]


@pytest.mark.parametrize(("flags", "message"), EXPORT_CASES)
def test_an_export_count_past_any_export_is_one_line_before_the_source(
    tmp_path: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the source was read before the flags were checked")

    monkeypatch.setattr(export_source, "load_source", refuse)  # sac-export imports it after the checks
    argv = [str(tmp_path / "run"), "--out", str(tmp_path / "out"), *flags]
    assert message in refused(export_cli.main, argv, prog="sac-export")


#: On bca952e: exit 1, "internal error: TypeError: system() missing required argument" (the function was
#: called as the env's class) and "ValueError: Overflow when unpacking long long" (torch's seed).
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env", "os:system"], "'os:system' names a builtin_function_or_method, not a class; use module:Class"),
        (["--seed", "100000000000000000000000"], "--seed must be at most 9223372036854775807"),
    ],
)
def test_a_train_value_that_was_an_internal_error_is_one_line(
    tmp_path: Path, refused: Callable[..., str], flags: list[str], message: str
) -> None:
    argv = ["--total-steps", "10", "--out", str(tmp_path / "run"), *flags]
    assert message in refused(train_cli.main, argv, prog="sac-train")


#: sac-sweep values found only inside Ray, or never. On bca952e: --out naming a file was exit 1
#: (NotADirectoryError); --seeds 10^11 (and 10^5) and 20 values x 1000 seeds started Ray and ran on; --cpus 10^11 failed
#: Ray's start-up after 38 s (exit 1, "internal error"); negative --cpus and --max-concurrent reached Ray.
SWEEP_CASES = [
    (["--out", "{tmp}/file"], "--out {tmp}/file is a file; pass a directory path"),
    (["--seeds", "100000"], "--seeds must be at most 10000, got 100000"),
    (["--grid", "utd=" + ",".join(map(str, range(1, 21))), "--seeds", "1000"], "make 20 x 1000 trials, more than"),
    (["--cpus", "100000000000"], "(the CPUs this process may use), got 100000000000"),
    (["--cpus=-1"], "--cpus must be from 0 (all) to"),
    (["--max-concurrent=-1"], "--max-concurrent must be 0 (as many as resources allow) or more, got -1"),
]


@pytest.mark.parametrize(("flags", "message"), SWEEP_CASES)
def test_a_sweep_value_found_inside_ray_is_one_line_before_it(
    tmp_path: Path, refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    def refuse() -> None:
        raise AssertionError("Ray was reached before the flags were checked")

    monkeypatch.setattr(sweep_cli, "_require_extra", refuse)
    (tmp_path / "file").write_text("not a directory")
    argv = ["--out", str(tmp_path / "sweep"), *(f.replace("{tmp}", str(tmp_path)) for f in flags)]
    assert message.replace("{tmp}", str(tmp_path)) in refused(sweep_cli.main, argv, prog="sac-sweep")
