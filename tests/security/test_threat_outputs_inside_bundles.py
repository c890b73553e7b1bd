"""Results written into the bundle they describe: ``sac-edge drill . --save`` (run from inside the bundle,
as a user naturally does) wrote ``./.drill.json`` inside it, a file the manifest does not list, beside the
verified files. ``--save`` now resolves the bundle's path and writes beside it, as documented."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sac_edge.edge_runtime import cli as edge_cli

QUICK = ["--faults", "none", "--episodes", "1", "--max-steps", "5", "--json"]


def test_drill_save_from_inside_the_bundle_writes_beside_it(
    bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(os.listdir(bundle))
    monkeypatch.chdir(bundle)
    assert edge_cli.main(["drill", ".", "--save", *QUICK]) == 0
    assert sorted(os.listdir(bundle)) == before  # was: + ".drill.json"
    saved = bundle.parent / f"{bundle.name}.drill.json"
    assert json.loads(saved.read_text())["rows"]


def test_drill_save_of_the_root_is_refused(refused: Callable[..., str]) -> None:
    assert "has no directory beside it; use --out FILE" in refused(edge_cli.main, ["drill", "/", "--save"])
