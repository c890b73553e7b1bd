"""A file must never make sac-edge import a module or call into one.

A bundle's manifest (``spec.env_id``) and a run dir's ``config.json`` (``env``) are untrusted: an
environment they name is used only if it is a registered gymnasium id. ``module:Class`` is imported only
from the command line (``--env``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from run_dirs import run_dir_from

from sac_edge.common.atomic import atomic_write_json
from sac_edge.common.envs import file_env
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.export import cli as export_cli
from sac_edge.train import cli as train_cli

EVIL = "sac_edge_evil_env"


@pytest.fixture
def evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An importable module that leaves a marker file when imported: importing it is the attack."""
    marker = tmp_path / "imported"
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{EVIL}.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Env:\n    pass\n")
    monkeypatch.syspath_prepend(str(mods))
    monkeypatch.delitem(sys.modules, EVIL, raising=False)
    return marker


def _set_manifest_env(bundle: Path, env_id: str) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["spec"]["env_id"] = env_id
    atomic_write_json(bundle / "manifest.json", manifest)


@pytest.mark.parametrize("env_id", [f"{EVIL}:Env", "os:abort", "pdb:set_trace", "NoSuchEnv-v0"])
def test_manifest_env_id_naming_a_module_is_refused_not_imported(
    bundle: Path, evil_module: Path, refused: Callable[..., str], env_id: str
) -> None:
    _set_manifest_env(bundle, env_id)
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1"])
    assert "not a registered gymnasium id" in err and "--env" in err
    assert not evil_module.exists() and EVIL not in sys.modules


def test_module_class_given_on_the_command_line_is_still_imported(bundle: Path, evil_module: Path) -> None:
    _set_manifest_env(bundle, f"{EVIL}:Env")
    rc = edge_cli.main(["run", str(bundle), "--env", f"{EVIL}:Env", "--duration", "0.1"])
    assert evil_module.exists()  # the user asked for it; the class is no env, so the spaces check refuses it
    assert rc == 2


def test_run_config_env_naming_a_module_is_not_imported_by_sac_export(
    tmp_path: Path, clean_bundle: Path, evil_module: Path, refused: Callable[..., str]
) -> None:
    run = run_dir_from(clean_bundle, tmp_path, f"{EVIL}:Env")
    err = refused(export_cli.main, [str(run), "--out", str(tmp_path / "out")], prog="sac-export")
    assert "config.json names environment" in err and "--env" in err
    assert not evil_module.exists() and not (tmp_path / "out").exists()


def test_run_config_env_naming_a_module_is_not_imported_by_sac_train_resume(
    tmp_path: Path, clean_bundle: Path, evil_module: Path, refused: Callable[..., str]
) -> None:
    run = run_dir_from(clean_bundle, tmp_path, f"{EVIL}:Env")
    err = refused(train_cli.main, ["--out", str(run), "--resume", "--total-steps", "10"], prog="sac-train")
    assert "not a registered gymnasium id" in err
    assert not evil_module.exists()


@pytest.mark.parametrize("value", [None, 7, ["Pendulum-v1"], "gymnasium.envs:Pendulum-v1"])
def test_file_env_accepts_only_registered_ids(value: object) -> None:
    assert file_env("Pendulum-v1", "x.json") == "Pendulum-v1"
    with pytest.raises(SacEdgeError, match="not a registered gymnasium id"):
        file_env(value, "x.json")


def test_a_file_naming_no_environment_asks_for_env() -> None:
    with pytest.raises(SacEdgeError, match=r"names no environment .*pass --env ID"):
        file_env("", "bundle/manifest.json")
