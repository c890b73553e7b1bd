"""BENCHMARKS.md stays a reference one can rerun: every command it quotes names a script or command that
exists with flags it accepts, every benchmark under ``bench/`` has its command there, and the goal table's
links land on a section."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "BENCHMARKS.md").read_text()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def quoted_commands() -> list[str]:
    """Every inline code span of BENCHMARKS.md that is a command (``python bench/...`` or ``sac-...``)."""
    spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", DOC)]
    return [s for s in spans if s.startswith(("python bench/", "sac-train ", "sac-edge ", "sac-sweep ", "sac-export "))]


@cache
def bench_helps() -> dict[str, list]:
    """``python SCRIPT --help`` of every quoted script, as [exit status, stdout, stderr] (tests/script_help.py:
    one interpreter imports the shared libraries once and forks a child per script)."""
    scripts = sorted({c.split()[1] for c in quoted_commands() if c.startswith("python ")})
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "script_help.py"), *scripts],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def bench_help(script: str) -> str:
    status, stdout, stderr = bench_helps()[script]
    assert status == 0, f"{script} --help failed: {stderr[-400:]}"
    return stdout


def cli_section(command: str) -> str:
    """The docs/CLI.md section of one command (``sac-edge run``, ``sac-train``, ...)."""
    text = (ROOT / "docs" / "CLI.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts:
        if part.split("\n", 1)[0].split(" [")[0].split(" BUNDLE")[0].split(" RUN")[0] == command:
            return part
    raise AssertionError(f"docs/CLI.md has no section for {command}")


def test_the_doc_quotes_commands() -> None:
    assert len(quoted_commands()) >= 10


@pytest.mark.parametrize("command", sorted(set(quoted_commands())))
def test_every_quoted_command_exists_with_its_flags(command: str) -> None:
    words = command.split()
    if words[0] == "python":
        script = words[1]
        assert (ROOT / script).is_file(), f"{script} does not exist"
        accepted = bench_help(script)
    else:
        name = " ".join(words[:2]) if words[0] == "sac-edge" else words[0]
        accepted = cli_section(name)
        if name == "sac-sweep":  # any flag it does not own goes to sac-train
            accepted += cli_section("sac-train")
    for flag in FLAG.findall(command.split("--train-args")[0]):
        assert re.search(re.escape(flag) + r"(?![\w-])", accepted), f"{flag} is not a flag of {' '.join(words[:2])}"


def test_every_benchmark_has_its_command_quoted() -> None:
    for script in sorted((ROOT / "bench").glob("*.py")):
        assert f"python bench/{script.name}" in DOC, f"BENCHMARKS.md quotes no command of bench/{script.name}"


def test_goal_links_land_on_sections() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,3} (.+)$", DOC, flags=re.M)
    }
    links = re.findall(r"\]\(#([^)]+)\)", DOC)
    assert links
    assert sorted(set(links) - anchors) == []
