"""``--amp auto`` and ``--compile auto``: what they resolve to, that the choice is logged and saved, and that
``--resume`` keeps the saved choice."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from sac_edge.common.config import parse_config
from sac_edge.train import defaults
from sac_edge.train.cli import main
from sac_edge.train.config import TrainConfig

CPU = torch.device("cpu")


def _bf16_units(monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool = False) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "want"), [(True, False, "bf16"), (False, True, "bf16"), (False, False, "off")]
)
def test_amp_auto_follows_the_cpu_bf16_units(monkeypatch, avx512_bf16, amx, want):
    _bf16_units(monkeypatch, avx512_bf16, amx)
    amp, reason = defaults.resolve_amp("auto", CPU)
    assert amp == want and reason.startswith(f"--amp auto -> {want}")
    assert defaults.resolve_amp("fp16", CPU) == ("fp16", "")  # an explicit choice is kept, silently


def test_cpuinfo_flags_when_torch_has_no_probes(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n")
    assert defaults.cpu_bf16_flags(info) == ("avx512_bf16",)
    info.write_text("flags\t\t: fpu sse2 avx2\n")
    assert defaults.cpu_bf16_flags(info) == ()


def test_compile_auto_is_on_only_when_the_run_repays_it():
    base = TrainConfig(amp="bf16", learning_starts=5_000)
    need = defaults.compile_break_even("bf16", base.batch_size)
    assert 1_000 < need < 100_000
    short, long = replace(base, total_steps=5_000 + need - 1), replace(base, total_steps=5_000 + need)
    assert defaults.resolve_compile(short, CPU, manual=True)[0] == "off"
    on, reason = defaults.resolve_compile(long, CPU, manual=True)
    assert on == "on" and f"{need:,} updates" in reason
    assert defaults.resolve_compile(long, CPU, manual=False)[0] == "off"  # autograd on a CPU: slower compiled
    assert defaults.resolve_compile(long, torch.device("cuda"), manual=False)[0] == "off"  # not measured there
    assert defaults.resolve_compile(replace(short, compile="on"), CPU, manual=True) == ("on", "")


def test_bare_compile_flag_means_on():
    assert parse_config(TrainConfig, ["--compile"], "sac-train", "").compile == "on"
    assert parse_config(TrainConfig, ["--compile", "off"], "sac-train", "").compile == "off"
    assert parse_config(TrainConfig, [], "sac-train", "").compile == "auto"


def test_choices_are_logged_saved_and_kept_on_resume(tmp_path: Path, capsys, monkeypatch):
    _bf16_units(monkeypatch, avx512_bf16=False)
    run = tmp_path / "run"
    args = ["--env", "Pendulum-v1", "--learning-starts", "100", "--hidden", "16,16", "--batch-size", "16"]
    assert main([*args, "--total-steps", "150", "--out", str(run), "--no-progress", "--eval-every", "0"]) == 0
    out = capsys.readouterr().out
    assert "--amp auto -> off (fp32)" in out and "--compile auto -> off" in out
    saved = json.loads((run / "config.json").read_text())
    assert (saved["amp"], saved["compile"]) == ("off", "off")
    _bf16_units(monkeypatch, avx512_bf16=True)  # the machine changed: the resumed run keeps its precision
    assert main(["--resume", "--total-steps", "200", "--out", str(run), "--no-progress"]) == 0
    assert "--amp auto" not in capsys.readouterr().out
    assert json.loads((run / "config.json").read_text())["amp"] == "off"


def test_a_run_saved_with_a_boolean_compile_resumes(tmp_path: Path):
    """Runs written before ``--compile auto`` saved ``"compile": false``."""
    run = tmp_path / "run"
    args = ["--env", "Pendulum-v1", "--learning-starts", "50", "--hidden", "16,16", "--batch-size", "16"]
    assert main([*args, "--total-steps", "60", "--out", str(run), "--no-progress", "--amp", "off"]) == 0
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "compile": False}))
    assert main(["--resume", "--total-steps", "70", "--out", str(run), "--no-progress"]) == 0
    assert json.loads((run / "config.json").read_text())["compile"] == "off"


@pytest.mark.parametrize(("extra", "backward", "warned"), [
    ([], "manual", False),
    (["--grad-checkpoint"], "autograd", True),
    (["--grad-checkpoint", "--critic-layers", "4"], "autograd", False),
])  # fmt: skip
def test_the_backward_that_ran_is_saved_and_shallow_checkpointing_warned(
    tmp_path: Path, capsys, extra, backward, warned
):
    run = tmp_path / "run"
    args = ["--env", "Pendulum-v1", "--learning-starts", "40", "--hidden", "16,16", "--batch-size", "16"]
    assert main([*args, *extra, "--total-steps", "50", "--out", str(run), "--no-progress", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert ("warning: --grad-checkpoint at --critic-layers 2 saves little" in out) == warned
    saved = json.loads((run / "config.json").read_text())
    assert saved["backward"] == saved["choices"]["backward"] == backward
    if extra:
        assert "--backward auto -> autograd: --grad-checkpoint needs it" in out


def test_help_states_the_checkpointing_trade(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "0.67-0.87x its speed" in text and "BENCHMARKS.md" in text


def test_checkpointing_without_a_layer_to_checkpoint_is_refused(tmp_path: Path, capsys):
    argv = ["--grad-checkpoint", "--critic-layers", "1", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert "--grad-checkpoint has no layer to checkpoint with --critic-layers 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
