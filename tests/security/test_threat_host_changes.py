"""Threat: the test suite changing the machine it runs on without saying so. As root on Debian,
``make test`` installs Debian packages and enables a binfmt handler for the aarch64 suite: the README says
so, docs/TESTING.md lists each change, and ``HOST_SETUP=0`` runs the suite without any of them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import aarch64  # noqa: E402

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_the_readme_says_what_make_test_changes_and_how_to_avoid_it() -> None:
    readme = (ROOT / "README.md").read_text()
    for said in ("apt-get", "qemu-user-static", "binfmt", "HOST_SETUP=0", "docs/TESTING.md"):
        assert said in readme, said
    testing = (ROOT / "docs" / "TESTING.md").read_text()
    for package in aarch64.APT_PACKAGES.values():
        assert f"`{package}`" in testing, package
    assert "update-binfmts --enable qemu-aarch64" in testing and "HOST_SETUP=0" in testing


@needs_make
def test_host_setup_0_reaches_prepare() -> None:
    recipe = subprocess.run(
        ["make", "-n", "test-aarch64", "HOST_SETUP=0"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert "aarch64.py prepare --no-host-setup" in recipe.stdout, recipe.stdout[-500:]


def test_prepare_without_host_setup_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root Debian x86_64 host missing the tools: nothing is run (no apt-get, mount or update-binfmts)
    and the suite skips in one line naming what is missing."""
    ran: list[list[str]] = []
    monkeypatch.setattr(aarch64.subprocess, "run", lambda argv, **_: ran.append(list(argv)))
    monkeypatch.setattr(aarch64.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(aarch64.platform, "python_version_tuple", lambda: ("3", "11", "7"))
    monkeypatch.setattr(aarch64.os, "geteuid", lambda: 0)
    monkeypatch.setattr(aarch64, "_os_id", lambda: "debian")
    monkeypatch.setattr(
        aarch64, "apt_sources", lambda: [("sources.list", "deb http://archive.invalid/debian bookworm main\n")]
    )
    monkeypatch.setattr(aarch64.shutil, "which", lambda tool: None)
    assert aarch64.main(["prepare", "--no-host-setup"]) == aarch64.SKIP
    assert ran == []
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("test-aarch64: skipped: needs qemu-user-static"), out
    assert "HOST_SETUP=0" in out[0]
