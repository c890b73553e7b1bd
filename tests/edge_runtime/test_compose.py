"""Every ``sac-edge run`` flag is checked before any work: a bad value is refused before a backend opens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sac_edge.common.config import options
from sac_edge.edge_runtime.config import RealtimeSection, RunConfig

# Every flag of ``sac-edge run`` (every field of RunConfig and of its sections) -> its bad values, each the
# arguments after ``run`` and what the one line says. ``{bundle}`` is a good bundle, ``{absent}`` a path that
# does not exist, ``{file}`` a regular file, ``{empty}`` an empty folder. All run with ``--backend auto``, which
# would time every backend.
BAD: dict[str, list[tuple[str, str]]] = {
    "--bundle": [("{absent}", "{absent}")],
    "--env": [("{bundle} --env NoSuchEnv-v9", "NoSuchEnv-v9")],
    "--seed": [("{bundle} --seed -1", "--seed must be from 0")],
    "--shift": [("{bundle} --shift g", "--shift entry 'g' is not NAME=NUMBER")],
    "--telemetry": [
        ("{bundle} --telemetry {file}", "already exists; choose another path or pass --overwrite-telemetry")
    ],
    "--overwrite-telemetry": [
        (
            "{bundle} --overwrite-telemetry=yes",
            "--overwrite-telemetry/--no-overwrite-telemetry: ignored explicit argument 'yes'",
        )
    ],
    "--trusted-keys": [("{bundle} --trusted-keys {absent}", "{absent}")],
    "--allow-downgrade": [
        (
            "{bundle} --allow-downgrade=yes",
            "--allow-downgrade/--no-allow-downgrade: ignored explicit argument 'yes'",
        )
    ],
    "--verbose": [
        (
            "{bundle} --verbose=yes",
            "--verbose/--no-verbose: ignored explicit argument 'yes'",
        )
    ],
    "--json": [("{bundle} --json=yes", "--json/--no-json: ignored explicit argument 'yes'")],
    # backend
    "--backend": [("{bundle} --backend gpu", "argument --backend: invalid choice: 'gpu'")],
    "--precision": [("{bundle} --precision fp8", "argument --precision: invalid choice: 'fp8'")],
    "--threads": [("{bundle} --threads 0", "--threads must be from 1 to")],
    "--auto-calls": [("{bundle} --auto-calls 0", "--auto-calls must be from 1 to 100000")],
    # loop
    "--rate-hz": [
        ("{bundle} --rate-hz 1e12", "--rate-hz must be from 0.001 to 100000"),
        ("{bundle} --rate-hz nan", "--rate-hz must be a finite number"),
    ],
    "--duration": [("{bundle} --duration=-1", "--duration must be from 0 (run until stopped)")],
    "--obs-fault": [("{bundle} --obs-fault drop", "argument --obs-fault: invalid choice: 'drop'")],
    "--inference-budget": [("{bundle} --inference-budget 0", "--inference-budget is a fraction of the period")],
    "--inference-timeout": [("{bundle} --inference-timeout 0", "--inference-timeout must be more than 0")],
    "--max-backend-errors": [("{bundle} --max-backend-errors 0", "--max-backend-errors must be at least 1")],
    "--spin-us": [("{bundle} --spin-us=-1", "--spin-us must be from 0 to")],
    "--warm-cache": [
        (
            "{bundle} --warm-cache=no",
            "--warm-cache/--no-warm-cache: ignored explicit argument 'no'",
        )
    ],
    # shield
    "--shield": [("{bundle} --shield off", "argument --shield: invalid choice: 'off'")],
    "--shield-window": [("{bundle} --shield-window=-1", "--shield-window must be from 0 (off)")],
    "--stuck-steps": [("{bundle} --stuck-steps 1", "--stuck-steps must be at least 2")],
    "--ramp-steps": [("{bundle} --ramp-steps=-1", "--ramp-steps must be from 0 (no ramp)")],
    "--fallback": [("{bundle} --fallback zero", "argument --fallback: invalid choice: 'zero'")],
    "--safe-action": [("{bundle} --safe-action nan", "--safe-action must be a finite number")],
    "--slew": [("{bundle} --slew=-1", "--slew takes finite non-negative changes")],
    # realtime
    "--realtime-priority": [("{bundle} --realtime-priority 100", "--realtime-priority must be 1..99 (0: off)")],
    "--idle-latency-us": [("{bundle} --idle-latency-us=-1", "--idle-latency-us -1 is negative")],
    "--lock-memory": [
        (
            "{bundle} --lock-memory=yes",
            "--lock-memory/--no-lock-memory: ignored explicit argument 'yes'",
        )
    ],
    "--cpus": [("{bundle} --cpus=-1", "--cpus takes CPU numbers from 0")],
    # budget
    "--mem-budget-mb": [("{bundle} --mem-budget-mb 0", "--mem-budget-mb must be a positive number")],
    "--power-budget-w": [("{bundle} --power-budget-w=-1", "--power-budget-w must be a positive number")],
    "--enforce-estimated-power": [
        (
            "{bundle} --enforce-estimated-power=yes",
            "--enforce-estimated-power/--no-enforce-estimated-power: ignored explicit argument 'yes'",
        )
    ],
    "--sensor-root": [
        ("{bundle} --sensor-root {absent}", "--sensor-root '{absent}' is not a directory"),
        ("{bundle} --finetune --sensor-root {empty}", "--sensor-root '{empty}' has no proc/<pid>/status"),
        ("{bundle} --mem-budget-mb 400 --sensor-root {empty}", "--sensor-root '{empty}' has no proc/<pid>/status"),
    ],
    # fine-tuning
    "--finetune": [("{bundle} --finetune (no torch)", "--finetune needs the Python package 'torch'")],
    "--resume": [("{bundle} --finetune --resume --restart", "--resume and --restart exclude each other")],
    "--restart": [("{bundle} --restart", "--restart only applies with --finetune")],
    "--finetune-dir": [("{bundle} --finetune --finetune-dir {file}", "--finetune-dir {file}")],
    "--finetune-buffer": [
        ("{bundle} --finetune --finetune-buffer 500", "--finetune-buffer 500 is below the 1000 rows fine-tuning needs"),
        ("{bundle} --finetune --learning-starts 5000 --finetune-buffer 2000", "is below the 5000 rows"),
    ],
    "--finetune-batch": [("{bundle} --finetune --finetune-batch 0", "--finetune-batch must be at least 1")],
    "--finetune-utd": [("{bundle} --finetune --finetune-utd 0", "--finetune-utd must be a positive number")],
    "--learner-cpu": [("{bundle} --finetune --learner-cpu 2", "--learner-cpu is a fraction of one core")],
    "--finetune-lr": [("{bundle} --finetune --finetune-lr 0", "--finetune-lr must be positive")],
    "--learning-starts": [("{bundle} --finetune --learning-starts 0", "--learning-starts must be at least 1")],
    "--swap-every": [("{bundle} --finetune --swap-every 0", "--swap-every must be at least 1")],
    "--promotion-window": [("{bundle} --finetune --promotion-window 0", "--promotion-window must be >= 1")],
    "--rollback-threshold": [
        ("{bundle} --finetune --rollback-threshold=-1", "--rollback-threshold must be >= 0"),
        ("{bundle} --finetune --rollback-threshold nan", "--rollback-threshold must be a finite number"),
    ],
    "--rollback-noise-z": [("{bundle} --finetune --rollback-noise-z=-0.5", "--rollback-noise-z must be >= 0")],
    "--shadow-max-diff": [
        ("{bundle} --finetune --shadow-max-diff 0", "--shadow-max-diff is a fraction of the action range in (0, 1]"),
        ("{bundle} --finetune --shadow-max-diff 1.5", "--shadow-max-diff is a fraction of the action range in (0, 1]"),
    ],
    "--explore-std": [("{bundle} --finetune --explore-std=-1", "--explore-std must be non-negative")],
}

#: Flags whose bad value can only be seen in the bundle (or the env it names), so after it is opened.
NEED_THE_BUNDLE = {"--bundle", "--env", "--trusted-keys"}

# In one child process: each case through the real CLI, then whether onnxruntime (which every backend
# here imports when it opens) was imported by then. The last case is a valid run, which must import it.
# A case that is not refused runs; the alarm ends one that would run on (a duration or rate out of range).
CHILD = """
import contextlib, io, json, signal, sys
from sac_edge.edge_runtime.cli import main
def ran_on(*_):
    raise TimeoutError("not refused: the run went on")
signal.signal(signal.SIGALRM, ran_on)
cases = json.loads(sys.argv[1])
out = []
for case in cases:
    if "(no torch)" in case:
        sys.modules["torch"] = None  # as on a device without it: find_spec("torch") is None
    argv = ["run", "--backend", "auto", "--duration", "0.05", *case.replace("(no torch)", "").split()]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        signal.alarm(30)
        rc = main(argv)
        signal.alarm(0)
    out.append({"rc": rc, "err": err.getvalue(), "onnxruntime": "onnxruntime" in sys.modules})
print(json.dumps(out))
"""


def test_every_flag_has_bad_values_here() -> None:
    """The table above is RunConfig's flags, generated from the classes: a new flag needs its bad value."""
    flags = [o.flag for o in options(RunConfig)]
    assert len(set(flags)) == len(flags)
    assert set(BAD) == set(flags), f"flags without a bad value: {sorted(set(flags) - set(BAD))}"


def test_every_bad_flag_is_refused_before_any_backend_opens(pendulum_bundle: Path, tmp_path: Path) -> None:
    """Each bad value with a good bundle: refused, and no backend opened. Each again with no bundle at all
    (but for the flags about the bundle and its env): the same refusal, so it came before the bundle."""
    (tmp_path / "file").write_text("a file")
    (tmp_path / "empty").mkdir()
    where = {
        "bundle": str(pendulum_bundle),
        "absent": str(tmp_path / "absent"),
        "file": str(tmp_path / "file"),
        "empty": str(tmp_path / "empty"),
    }
    cases = [(case.format(**where), message.format(**where)) for bad in BAD.values() for case, message in bad]
    cases += [
        (case.format(**{**where, "bundle": where["absent"]}), message.format(**where))
        for flag, bad in BAD.items()
        if flag not in NEED_THE_BUNDLE
        for case, message in bad
    ]
    argv_cases = [case for case, _ in cases] + [str(pendulum_bundle)]  # the valid run, last, needs no torch
    argv_cases.sort(key=lambda case: (case == str(pendulum_bundle), "(no torch)" in case))
    argv = [sys.executable, "-c", CHILD, json.dumps(argv_cases)]
    child = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    results = dict(zip(argv_cases, json.loads(child.stdout.strip().splitlines()[-1])))
    wrong = []
    for case, message in cases:
        result = results[case]
        lines = result["err"].strip().splitlines()
        if not (
            result["rc"] == 2 and len(lines) == 1 and lines[0].startswith("sac-edge: error: ") and message in lines[0]
        ):
            wrong.append((case, message, result["rc"], lines[-3:]))
        assert not result["onnxruntime"], f"{case}: a backend was opened before the refusal"
    assert not wrong, "\n".join(map(str, wrong))
    valid = results[str(pendulum_bundle)]
    assert valid["rc"] == 0 and valid["onnxruntime"], valid  # the observable does see a backend open


@pytest.mark.parametrize("opt", options(RunConfig), ids=lambda o: o.flag)
def test_every_setting_of_the_wrong_type_is_refused_in_python(opt: Any, tmp_path: Path) -> None:
    """The library path (``Runtime(RunConfig(...))``) gets what argparse checks on the command line: a
    value of the wrong type is one line naming the flag, before anything is opened."""
    from sac_edge.common.errors import SacEdgeError

    wrong = 1 if opt.type is str else "1"
    cfg = RunConfig.of(**{"bundle": str(tmp_path / "absent"), opt.dest: wrong})
    with pytest.raises(SacEdgeError, match=f"^{opt.flag} must be "):
        cfg.check()


@pytest.mark.parametrize("flags", ["--finetune-utd inf", "--finetune-lr 0"])
def test_finetune_numbers_are_checked_without_fine_tuning_work(flags: str, tmp_path: Path) -> None:
    from sac_edge.common.errors import SacEdgeError
    from sac_edge.edge_runtime.compose import validate

    name, value = flags.split()
    with pytest.raises(SacEdgeError, match=name):  # the bundle is not even looked at
        validate(RunConfig.of(str(tmp_path / "absent"), finetune=True, **{name[2:].replace("-", "_"): float(value)}))


# ``sac-edge run``'s flags that are the scheduler's, the env's or the terminal's: the runtime takes none of them.
NOT_THE_RUNTIMES = {
    "shift", "verbose", "json", "duration", "spin_us", "warm_cache", "realtime_priority", "idle_latency_us",
    "lock_memory",
}  # fmt: skip


def test_the_runtime_options_are_the_run_flags_the_runtime_works_from(pendulum_bundle: Path) -> None:
    """``RuntimeOptions`` holds ``sac-edge run``'s flags but the scheduler's, under the same names and defaults,
    and ``RunConfig.runtime_options`` carries each one's value; the ``--shield`` switch is whether the
    runtime's ``shield`` holds the shield's options or None."""
    import dataclasses

    from sac_edge.edge_runtime.config import RuntimeOptions

    run = {o.dest: o for o in options(RunConfig)}
    runtime = {o.dest: o for o in options(RuntimeOptions)}
    assert set(run) - set(runtime) == NOT_THE_RUNTIMES | {"shield"} and set(runtime) <= set(run)
    assert all(runtime[d].flag == run[d].flag for d in runtime)
    assert RunConfig(bundle=str(pendulum_bundle)).runtime_options() == RuntimeOptions(str(pendulum_bundle))
    given = dict(
        seed=7, env="Pendulum-v1", rate_hz=50.0, obs_fault="hold", inference_budget=0.25, inference_timeout=1.5,
        max_backend_errors=3, cpus=(0,), backend="onnxruntime", threads=1, shield_window=2,
        stuck_steps=0, ramp_steps=1, fallback="fixed", slew=(0.5,), mem_budget_mb=900.0, finetune_lr=1e-3,
        telemetry=str(pendulum_bundle.parent / "absent.jsonl"), duration=3.0, spin_us=0.0,
    )  # fmt: skip
    theirs = {k: v for k, v in given.items() if k in runtime}
    made = RunConfig.of(str(pendulum_bundle), **given).runtime_options()
    assert made == RuntimeOptions.of(str(pendulum_bundle), **theirs)
    expected = {"bundle": str(pendulum_bundle), **given}
    for dest, opt in runtime.items():
        value = made
        for name in opt.path:
            value = getattr(value, name)
        assert value == expected.get(dest, opt.field.default), dest
    guards = RunConfig.of(str(pendulum_bundle), shield="guards", **given).runtime_options()
    assert (
        guards
        == dataclasses.replace(made, shield=None)
        == RuntimeOptions.of(str(pendulum_bundle), shield="guards", **theirs)
    )
    assert RunConfig.of(str(pendulum_bundle), shield="on", **given).runtime_options() == made


def test_a_bad_shield_switch_is_one_line_in_python(tmp_path: Path) -> None:
    from sac_edge.common.errors import SacEdgeError
    from sac_edge.edge_runtime.config import RuntimeOptions, ShieldSection

    for made in (
        lambda: RuntimeOptions.of(str(tmp_path), shield="x"),
        lambda: RunConfig.of(str(tmp_path), shield="x").runtime_options(),
    ):
        with pytest.raises(SacEdgeError, match=r"^--shield must be one of on, guards, got 'x'$"):
            made()
    with pytest.raises(SacEdgeError, match=r"^RuntimeOptions.shield must be a ShieldOptions, got ShieldSection.*"
                       r"pass ShieldOptions\(\.\.\.\) or None$"):  # fmt: skip
        RuntimeOptions(str(tmp_path), shield=ShieldSection())  # type: ignore[arg-type]


def test_sac_edge_run_checks_its_options_once(pendulum_bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sac-edge run`` checks every flag once, before any work (``compose.validate``); the runtime it makes
    takes the options as checked."""
    from sac_edge.edge_runtime.config import RuntimeOptions
    from sac_edge.edge_runtime.run import run_command

    checks: list[str] = []
    check = RuntimeOptions.check

    def counted(self: RuntimeOptions) -> None:
        checks.append(self.bundle)
        check(self)

    monkeypatch.setattr(RuntimeOptions, "check", counted)
    cfg = RunConfig.of(str(pendulum_bundle), backend="onnxruntime", duration=0.2, rate_hz=50.0, warm_cache=False)
    summary = run_command(cfg, lambda _: None)
    assert summary.schedule.stopped_by == "duration" and checks == [str(pendulum_bundle)]


@pytest.mark.parametrize(
    ("priority", "given", "held"), [(0, None, None), (50, None, 0), (50, 20, 20), (0, 100, 100), (0, 0, 0)]
)
def test_the_idle_cap_is_the_flag_else_zero_with_a_priority(priority: int, given: int | None, held: int | None) -> None:
    """What ``sac-edge run`` and the ROS node hold (``RealtimeSection.idle_cap_us``): a real-time loop keeps
    the cores awake unless told otherwise; without a priority the kernel chooses."""
    assert RealtimeSection(realtime_priority=priority, idle_latency_us=given).idle_cap_us == held
