"""Threat: an output flag that names a file already there (a typo naming ``finetune/last_good.safetensors``,
a measurement of last week's run). ``sac-edge drill --out``/``--save`` and ``sac-edge bench --out``/``--plot``
refuse an existing file in one line, exit 2, before the bundle is opened, unless told ``--overwrite`` (as
``sac-edge run --telemetry`` needs ``--overwrite-telemetry``); the write claims the path, so a file that
appears meanwhile is not replaced either (``test_threat_concurrent_writers``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.edge_runtime.cli import main

PRECIOUS = b"the only copy of the fine-tuned weights"

DRILL = ["drill", "--faults", "none", "--episodes", "1", "--max-steps", "5"]
BENCH = ["bench", "--backends", "onnxruntime", "--batch", "1", "--calls", "5"]
#: command, the flags that name the output (``{out}``: the planted file), where the output goes.
CASES = {
    "drill --out": ([*DRILL, "--out", "{out}"], "w.json"),
    "drill --save": ([*DRILL, "--save"], None),
    "bench --out": ([*BENCH, "--out", "{out}"], "w.json"),
    "bench --plot": ([*BENCH, "--plot", "{out}"], "w.png"),
}


def _argv(case: str, bundle: Path) -> tuple[list[str], Path]:
    """The command line of ``case`` on ``bundle`` and the file it writes."""
    words, name = CASES[case]
    out = bundle.parent / (name or f"{bundle.name}.drill.json")
    argv = [w.replace("{out}", str(out)) for w in words]
    return [argv[0], str(bundle), *argv[1:]], out


@pytest.mark.parametrize("case", list(CASES))
def test_an_existing_output_is_refused_in_one_line_and_kept(
    case: str, bundle: Path, refused: Callable[..., str]
) -> None:
    argv, out = _argv(case, bundle)
    out.write_bytes(PRECIOUS)
    err = refused(main, argv)
    assert str(out) in err and "already exists" in err and "--overwrite" in err, err
    assert out.read_bytes() == PRECIOUS


@pytest.mark.parametrize("case", ["drill --out", "bench --plot"])
def test_the_refusal_comes_before_the_bundle_is_opened(case: str, tmp_path: Path, refused: Callable[..., str]) -> None:
    argv, out = _argv(case, tmp_path / "no-such-bundle")
    out.write_bytes(PRECIOUS)
    assert "already exists" in refused(main, argv)


def test_a_planted_dangling_symlink_is_refused_and_not_followed(bundle: Path, refused: Callable[..., str]) -> None:
    argv, out = _argv("bench --out", bundle)
    victim = bundle.parent / "outside" / "victim"
    out.symlink_to(victim)
    assert "already exists" in refused(main, argv)
    assert out.is_symlink() and not victim.exists()


@pytest.mark.parametrize("case", list(CASES))
def test_overwrite_replaces_the_existing_output(case: str, bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, out = _argv(case, bundle)
    out.write_bytes(PRECIOUS)
    assert main([*argv, "--overwrite"]) == 0, capsys.readouterr().err
    written = out.read_bytes()
    assert written.startswith(b"\x89PNG" if out.suffix == ".png" else b"{"), written[:16]
