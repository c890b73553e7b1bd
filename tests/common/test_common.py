from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.atomic import atomic_dir, atomic_path, atomic_write_json
from sac_edge.common.config import build_parser, parse_config
from sac_edge.common.errors import SacEdgeError, run_cli
from sac_edge.common.manifest import file_entry, read_manifest, write_manifest
from sac_edge.common.summary import emit_json, json_safe, strict_json
from sac_edge.common.table import format_table
from sac_edge.train.config import TrainConfig


def test_atomic_path_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert list(tmp_path.iterdir()) == [target]


def test_atomic_dir_is_complete_or_absent(tmp_path):
    final = tmp_path / "bundle"
    with pytest.raises(RuntimeError), atomic_dir(final) as staging:
        (staging / "a").write_text("1")
        raise RuntimeError("crash")
    assert not final.exists() and list(tmp_path.iterdir()) == []
    with atomic_dir(final) as staging:
        (staging / "a").write_text("1")
    with atomic_dir(final, replace=True) as staging:
        (staging / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["b"]
    with pytest.raises(FileExistsError), atomic_dir(final):
        pass


def test_manifest_verifies_checksums(tmp_path):
    (tmp_path / "policy.onnx").write_bytes(b"graph")
    write_manifest(tmp_path, {"spec": {}, "files": {"policy.onnx": file_entry(tmp_path, "policy.onnx", kind="onnx")}})
    assert read_manifest(tmp_path)["format_version"] == 1
    (tmp_path / "policy.onnx").write_bytes(b"tampered")
    with pytest.raises(SacEdgeError, match=r"checksum mismatch for policy\.onnx"):
        read_manifest(tmp_path)
    atomic_write_json(tmp_path / "manifest.json", {"format_version": 99})
    with pytest.raises(SacEdgeError, match=r"format_version 99, newer than the 1 .* pip install -U sac-edge"):
        read_manifest(tmp_path)


def test_config_parser_uses_field_help_and_types():
    help_text = build_parser(TrainConfig, "sac-train", "x").format_help()
    assert "replay capacity" in help_text and "--no-progress" in help_text
    cfg = parse_config(TrainConfig, ["--hidden", "64,32", "--amp", "bf16", "--compile"], "sac-train", "x")
    assert cfg.hidden == (64, 32) and cfg.amp == "bf16" and cfg.compile == "on"
    assert parse_config(TrainConfig, ["--no-compile"], "sac-train", "x").compile == "off"
    with pytest.raises(SacEdgeError, match=r"argument --amp: invalid choice: 'fp8'.*pass one of the choices") as err:
        parse_config(TrainConfig, ["--amp", "fp8"], "sac-train", "x")
    assert err.value.exit_code == 2


def test_run_cli_turns_errors_into_one_line(capsys):
    def bad(_argv):
        raise SacEdgeError("the problem; the fix")

    def broken(_argv):
        raise ValueError("boom\nsecond line")

    assert run_cli("prog", bad, []) == 2
    assert capsys.readouterr().err == "prog: error: the problem; the fix\n"
    assert run_cli("prog", broken, []) == 1
    assert capsys.readouterr().err == "prog: internal error: ValueError: boom\n"


def test_json_summary_is_last_line_and_json_safe(capsys):
    print("report")
    emit_json({"x": np.float32(1.5), "bad": math.nan, "rows": [np.int64(3)]})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == {"x": 1.5, "bad": None, "rows": [3]}
    assert json_safe({"a": (math.inf,)}) == {"a": [None]}


def test_common_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys, sac_edge.common.atomic, sac_edge.common.bundle, sac_edge.common.config, sac_edge.common.envs,"
        " sac_edge.common.errors, sac_edge.common.jsonfile, sac_edge.common.manifest, sac_edge.common.spec,"
        " sac_edge.common.summary;"
        " print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_importing_signing_prints_nothing() -> None:
    """Every console script imports common.signing: on Python 3.8 (JetPack 5) cryptography's deprecation
    warning would be a second stderr line on every command."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import sac_edge.common.signing"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize(
    ("blocked", "module", "argv", "extra"),
    [
        ("torch", "sac_edge.export.cli", ["runs/none", "--out", "{tmp}/bundle"], "train"),
        ("torch", "sac_edge.train.cli", ["--env", "Pendulum-v1", "--out", "{tmp}/run"], "train"),
        ("tqdm", "sac_edge.train.cli", ["--env", "Pendulum-v1", "--out", "{tmp}/run"], "train"),
        ("ray", "sac_edge.sweep.cli", ["--env", "Pendulum-v1", "--seeds", "1", "--out", "{tmp}/sweep"], "sweep"),
        ("torch", "sac_edge.edge_runtime.cli", ["run", "runs/none", "--finetune"], "finetune"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    tmp_path: Path, blocked: str, module: str, argv: list[str], extra: str
) -> None:
    """As in the torch-free installs (``pip install sac-edge`` on the device, .venv-ros2): on 27d6dc3 sac-export
    printed a traceback (torch imported with its module) and sac-train an internal error naming no extra."""
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"  # import fails, find_spec says absent
        f"from {module} import main\n"
        f"sys.exit(main({[a.format(tmp=tmp_path) for a in argv]!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"sac-edge[{extra}]" in lines[0], lines
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_strict_json_writes_null_for_every_missing_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``sac-edge ros2`` after 0 steps printed ``"step_p50_us": NaN`` (what jq, JavaScript and Go reject)."""
    value = {"p50": float("nan"), "rows": [np.float32("inf"), -math.inf, (1, np.float64("nan"))], "ok": 1.5}
    expected = {"p50": None, "rows": [None, None, [1, None]], "ok": 1.5}

    def refuse(constant: str) -> None:
        raise AssertionError(constant)

    assert json.loads(strict_json(value), parse_constant=refuse) == expected
    emit_json(value)
    assert json.loads(capsys.readouterr().out, parse_constant=refuse) == expected
    atomic_write_json(tmp_path / "s.json", value)
    assert json.loads((tmp_path / "s.json").read_text(), parse_constant=refuse) == expected


def test_a_table_shows_large_floats_as_whole_numbers() -> None:
    """``make demo``'s bench table mixed ``1.214e+04`` and ``321756`` in one column."""
    table = format_table([(12140.4, 321756.2, 0.05641, 999.94, None)], ("a", "b", "c", "d", "e"))
    assert table.splitlines()[-1].split() == ["12140", "321756", "0.05641", "999.9", "-"]
    assert "e+" not in format_table([(4.4e4, 1e9)], ("x", "y"))
