"""Threat: the test suite changing the machine it runs on without saying so. As root on Debian,
``make test`` installs Debian packages and enables a binfmt handler for the aarch64 suite: the README says
so, docs/TESTING.md lists each change, and ``HOST_SETUP=0`` runs the suite without any of them."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import zipfile
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


HOST_CHANGERS = ("apt-get", "apt", "dpkg", "update-binfmts", "mount", "umount", "mmdebstrap")
"""What the aarch64 set-up runs (or could) to change the host."""


@needs_make
@pytest.mark.parametrize("target", ["test-aarch64", "test"])
def test_a_dry_run_of_make_changes_nothing_on_the_host(tmp_path: Path, target: str) -> None:
    """``make -n`` (a preview, and what the tests that read recipes run) under a PATH whose apt-get,
    update-binfmts, mount ... only record their calls, as root (a user namespace's when not root): none is
    called. Make runs a recipe line holding ``$(MAKE)`` even under ``-n``; on 27d6dc3 that line also ran
    ``aarch64.py prepare``, which installed qemu with apt-get and enabled binfmt_misc's handler from pytest."""
    stubs, calls = tmp_path / "bin", tmp_path / "calls"
    stubs.mkdir()
    for name in HOST_CHANGERS:
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\nexit 1\n')
        (stubs / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    as_root = [] if os.geteuid() == 0 or shutil.which("unshare") is None else ["unshare", "--map-root-user"]
    if as_root and subprocess.run([*as_root, "true"], capture_output=True, check=False).returncode != 0:
        as_root = []  # no user namespaces here: prepare stops at "needs root", before any set-up
    dry = subprocess.run(
        [*as_root, "make", "-n", target, f"PY={sys.executable}"], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "scripts/aarch64.py prepare" in dry.stdout  # printed, not run
    assert not calls.exists(), f"make -n {target} ran: {calls.read_text()}"


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


def _makefile_pins(variable: str) -> list[str]:
    """The Makefile's ``variable := ...`` (continued lines joined), one pin each, quotes and extras dropped."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(f"{variable} :="))
    pins = line.split(":=", 1)[1].replace('"', "").split()
    return [pin.split("[")[0] + pin[pin.index("]") + 1 :] if "[" in pin else pin for pin in pins]


def _hashed(name: str) -> dict[str, int]:
    """``requirements/name``: each ``package==version`` and how many sha256 hashes it carries."""
    entries: dict[str, int] = {}
    for block in (ROOT / "requirements" / name).read_text().replace("\\\n", " ").splitlines():
        if "==" in block and not block.startswith("#"):
            entries[block.split()[0].lower()] = block.count("--hash=sha256:")
    return entries


@pytest.mark.parametrize(
    ("variable", "hashed", "per_file"),
    [("ROS2_PINS", "ros2-cp311.txt", 1), ("DEVICE_PINS", "aarch64-pins-cp311.txt", 1)],
)
def test_every_pinned_download_is_in_its_hash_file(variable: str, hashed: str, per_file: int) -> None:
    """On bca952e nothing was pinned by hash and ``ros-lifecycle-msgs`` had no version."""
    pins, entries = _makefile_pins(variable), _hashed(hashed)
    assert all("==" in pin for pin in pins), pins
    missing = [pin for pin in pins if pin.lower() not in entries]
    assert missing == [], f"regenerate requirements/{hashed} (docs/TESTING.md): {missing}"
    assert all(count >= per_file for count in entries.values()), entries


@needs_make
def test_the_ros2_venv_installs_only_hash_checked_files() -> None:
    recipe = subprocess.run(
        ["make", "-n", "-B", ".venv-ros2/.installed-stamp", "PY=" + sys.executable],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert f"--require-hashes --no-deps --no-build-isolation -r requirements/ros2-{tag}.txt" in recipe, recipe
    assert "--no-deps --no-build-isolation -e ." in recipe, recipe


@needs_make
@pytest.mark.skipif(
    platform.machine() != "x86_64" or sys.version_info < (3, 10), reason="ROS 2's wheels install only on x86_64, 3.10+"
)
def test_a_failed_ros2_venv_fails_make_with_the_logs_tail(tmp_path: Path) -> None:
    """Where ROS 2's wheels can install, a failed install fails ``make venv-ros2`` (so ``make test``) and shows
    why. On 27d6dc3 it printed "skipped" and exited 0 (empy's sdist could not build without a pip cache), and
    ``make test`` passed with tests/ros2 skipped. Here the venv is made without pip (fast), so the first pip
    step fails."""
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nif [ "$1 $2" = "-m venv" ]; then shift 2; exec {sys.executable} -m venv --without-pip "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    venv, log = tmp_path / "venv-ros2", tmp_path / "venv-ros2.log"
    proc = subprocess.run(
        ["make", "--no-print-directory", "venv-ros2", f"PY={python}", f"ROS2={venv}", f"ROS2_LOG={log}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout[-2000:]
    out = proc.stdout.splitlines()
    assert any(line.startswith("venv-ros2: [0 s] ") for line in out), out  # each step announced
    assert out[-1].startswith("venv-ros2: FAILED: ") and str(log) in out[-1], out[-5:]
    assert "No module named pip" in proc.stdout  # the log's tail, shown
    assert "skipped" not in proc.stdout and not venv.exists()  # no half-built venv for the tests to find


def test_the_aarch64_pins_install_is_hash_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pins lane's dependencies come from the hash file alone; a pin it lacks is refused in one line."""
    ran: list[list[str]] = []

    def run(argv: list[str], **_: object) -> None:  # pip and compileall, recorded; pip's --target made
        ran.append(list(argv))
        if "--target" in argv:
            Path(argv[argv.index("--target") + 1]).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(aarch64, "run", run)
    wheel = tmp_path / "sac_edge-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("sac_edge-0.1.0.dist-info/METADATA", "Name: sac-edge\nRequires-Dist: numpy>=1.24\n")
    pins = tuple(_makefile_pins("DEVICE_PINS"))
    env = aarch64.Env("pins", pins, False, aarch64.check_hashed(pins, aarch64.PINS_HASHED))
    aarch64.install(tmp_path / "place", env, wheel, "aarch64", "2026-01-01", tmp_path)
    first = ran[0]
    assert first[first.index("--require-hashes") :][:4] == ["--require-hashes", "--no-deps", "-r", str(env.hashed)]
    assert str(wheel) not in first and "--platform=manylinux2014_aarch64" in first
    with pytest.raises(SystemExit, match=r"aarch64-pins-cp311.txt lacks numpy==9.9.9; regenerate it"):
        aarch64.check_hashed(("numpy==9.9.9",), aarch64.PINS_HASHED)
