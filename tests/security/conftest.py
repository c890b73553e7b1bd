"""The threat model as tests: each file is one class of hostile or careless input (see
docs/THREATS.md). Hostile files are built in ``tmp_path`` from a clean bundle."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edge_runtime"))  # bundles.py, the test bundles

from bundles import make_bundle
from sac_edge.common.signing import generate_keypair


@pytest.fixture(scope="session")
def clean_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Pendulum-v1 bundle as sac-export lays it out (fp32 only), never modified."""
    return make_bundle(tmp_path_factory.mktemp("security") / "clean", int8=None)


@pytest.fixture
def bundle(clean_bundle: Path, tmp_path: Path) -> Path:
    """A private copy of the clean bundle for one test to tamper with."""
    return Path(shutil.copytree(clean_bundle, tmp_path / "bundle"))


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    """A signing key and a trusted-keys directory holding its public key."""
    private, public = generate_keypair(tmp_path / "fleet")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copyfile(public, trusted / public.name)
    return private, trusted


def one_line_error(capsys: pytest.CaptureFixture[str], rc: int, prog: str = "sac-edge", code: int = 2) -> str:
    """The single stderr line of a refused command (asserting exit ``code`` and no traceback)."""
    err = capsys.readouterr().err.strip()
    assert rc == code, err
    assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: "), err
    return err


@pytest.fixture
def refused(capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """``refused(main, argv)``: run a console main, expect one stderr line and exit 2, return the line."""

    def check(main: Callable[[list[str]], int], argv: list[str], prog: str = "sac-edge", code: int = 2) -> str:
        return one_line_error(capsys, main(argv), prog, code)

    return check


@pytest.fixture(scope="session")
def clean_finetune_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small bundle as sac-export writes it for fine-tuning (never modified)."""
    from finetune_bundles import make_finetune_bundle

    return make_finetune_bundle(tmp_path_factory.mktemp("security") / "finetune")


@pytest.fixture(scope="session")
def sb3_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained Stable-Baselines3 SAC zip for Pendulum-v1 (hidden [8]; alpha learned: ``log_ent_coef``),
    never modified: the hostile zips are copies of it."""
    sb3 = pytest.importorskip("stable_baselines3")
    model = sb3.SAC("MlpPolicy", "Pendulum-v1", policy_kwargs={"net_arch": [8]}, buffer_size=10, device="cpu")
    path = tmp_path_factory.mktemp("sb3") / "sac.zip"
    model.save(path)
    return path
