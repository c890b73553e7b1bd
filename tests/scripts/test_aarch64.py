"""scripts/aarch64.py (``make test-aarch64``) where no emulation is needed: when it skips and why, the
archive it reads from apt's sources, the binfmt entry it accepts, the /proc/cpuinfo it generates, the
chroot command it builds, and its comparison of actions against the parity gate's tolerances."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
sys.path.insert(0, str(ROOT / "scripts"))
import aarch64  # noqa: E402

from sac_edge.common.bundle import Bundle  # noqa: E402
from sac_edge.common.spec import PolicySpec  # noqa: E402
from sac_edge.common.tolerance import tolerance  # noqa: E402
from sac_edge.edge_runtime.backends.parity_gate import INT8_KERNEL_FRAC  # noqa: E402

# qemu 7.2's AT_HWCAP for these models, read in the arm64 chroot with getauxval(AT_HWCAP)
HWCAP_A57, HWCAP_N1 = 0x8FB, 0x119FFB
# binfmt_misc's entry as Debian's qemu-user-static registers it (update-binfmts --enable qemu-aarch64)
DEBIAN_ENTRY = (
    "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n"
)
READY = aarch64.Host("x86_64", True, True, "3.11", "http://archive.example/debian")


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        (READY, None),
        (READY._replace(machine="aarch64"), "aarch64 already"),
        (READY._replace(machine="riscv64"), "needs an x86_64 machine (this one is riscv64)"),
        (READY._replace(root=False), "needs root"),
        (READY._replace(debian=False), "needs a Debian machine"),
        (READY._replace(python="3.12"), "must be the arm64 chroot's 3.11 (not 3.12)"),
        (READY._replace(archive=None), "apt's sources name no Debian archive"),
        (READY._replace(missing=("mmdebstrap",)), "apt-get could not install mmdebstrap"),
        (READY._replace(binfmt="binfmt_misc ... lacks the F flag"), "lacks the F flag"),
    ],
)
def test_skip_reason(host: aarch64.Host, reason: str | None) -> None:
    got = aarch64.skip_reason(host)
    assert got == reason if reason is None else reason in (got or "")


def test_unchecked_fields_pass_until_checked() -> None:
    """prepare checks in stages: the fields not looked at yet must not stop it early."""
    assert aarch64.skip_reason(aarch64.Host("x86_64", True, True)) is None


@needs_make
def test_prepare_skips_in_one_line_and_succeeds_for_make(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(aarch64.platform, "machine", lambda: "riscv64")
    assert aarch64.main(["prepare"]) == aarch64.SKIP
    out = capsys.readouterr().out.splitlines()
    assert out == ["test-aarch64: skipped: needs an x86_64 machine (this one is riscv64)"]
    recipe = subprocess.run(["make", "-n", "test-aarch64"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert f"-ne {aarch64.SKIP} ]; then exit" in recipe.stdout  # make turns the skip into success


@needs_make
def test_make_test_runs_it() -> None:
    dry = subprocess.run(["make", "-n", "-p", "test"], cwd=ROOT, capture_output=True, text=True, check=False)
    rule = next(line for line in dry.stdout.splitlines() if line.startswith("test:"))
    assert "test-aarch64" in rule.split()


DEB822 = """Types: deb
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://archive.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://archive.example/debian-security
Suites: bookworm-security
Components: main
"""


ONE_LINE = "deb [signed-by=/k.gpg arch=amd64] http://a.example/debian bookworm main\n"
COMMENTED = "# deb http://a.example/debian bookworm main\ndeb-src http://b.example/debian bookworm main\n"
BACKPORTS = "deb http://a.example/debian bookworm-backports main\n"
OTHER = "deb http://c.example/d trixie contrib main\n"


@pytest.mark.parametrize(
    ("sources", "archive"),
    [
        ([("debian.sources", DEB822)], "http://archive.example/debian"),
        ([("debian.sources", DEB822.split("\n\n")[1])], None),  # security only
        ([("debian.sources", "Enabled: no\n" + DEB822.split("\n\n")[0])], None),
        ([("sources.list", ONE_LINE)], "http://a.example/debian"),
        ([("sources.list", COMMENTED)], None),
        ([("x.list", BACKPORTS), ("y.list", OTHER)], "http://c.example/d"),
        ([], None),
    ],
)
def test_debian_archive_from_apt_sources(sources: list[tuple[str, str]], archive: str | None) -> None:
    assert aarch64.debian_archive(sources) == archive


def test_binfmt_entry() -> None:
    assert aarch64.binfmt_problem(DEBIAN_ENTRY) is None
    assert "F flag" in (aarch64.binfmt_problem(DEBIAN_ENTRY.replace("flags: PF", "flags: P")) or "")
    assert "disabled" in (aarch64.binfmt_problem(DEBIAN_ENTRY.replace("enabled", "disabled")) or "")
    assert "no qemu-aarch64 entry" in (aarch64.binfmt_problem(None) or "")


def test_cpuinfo_says_which_model_has_the_dot_product() -> None:
    """Xavier's Carmel (cortex-a57 here) lists no asimddp, Orin's A78AE (neoverse-n1 here) does."""
    a57, n1 = aarch64.cpu_features(HWCAP_A57, 0), aarch64.cpu_features(HWCAP_N1, 0)
    assert a57 == ["fp", "asimd", "aes", "pmull", "sha1", "sha2", "crc32", "cpuid"]
    assert "asimddp" in n1 and "asimddp" not in a57 and {"atomics", "fphp", "asimdhp"} <= set(n1)
    assert aarch64.cpu_features(0, 1 << 1) == ["sve2"]


def test_cpuinfo_is_laid_out_as_linux_writes_it() -> None:
    text = aarch64.cpuinfo("neoverse-n1", HWCAP_N1, 0, 3)
    blocks = [b for b in text.split("\n\n") if b]
    assert len(blocks) == 3
    for i, block in enumerate(blocks):
        fields = dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in block.splitlines()))
        assert fields["processor"] == str(i) and fields["CPU part"] == "0xd0c" and fields["CPU implementer"] == "0x41"
        assert fields["CPU architecture"] == "8" and "asimddp" in fields["Features"].split()
    assert "CPU part\t: 0xd07" in aarch64.cpuinfo("cortex-a57", HWCAP_A57, 0, 1)


def test_chroot_command_mounts_proc_before_the_generated_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cmd = aarch64.chrooted(tmp_path / "root", "cortex-a57", ["python3", "-c", "x y"], "/src/tests", cpuinfo, {"A": "1"})
    assert cmd[:5] == ["unshare", "--mount", "--propagation", "private", "sh"]
    script = cmd[-1]
    assert script.index("mount -t proc") < script.index(f"mount --bind {cpuinfo}")
    assert "QEMU_CPU=cortex-a57" in script and "A=1" in script and "'x y'" in script and "cd /src/tests" in script


def test_lanes_run_the_device_suite_and_the_cli_under_their_cpu(tmp_path: Path) -> None:
    lane = aarch64.Lane(aarch64.Env("pins", (), False), "cortex-a57", ("cortex-a57", "neoverse-n1"))
    steps = aarch64.lane_steps(lane, "/src/runs/aarch64", ["common", "test_imports.py"])
    assert steps[0].argv[-2:] == ["common", "test_imports.py"] and steps[0].cwd == "/src/tests"
    assert [s.argv[1] for s in steps[1:4]] == ["run", "bench", "doctor"] and {s.cpu for s in steps[:4]} == {
        "cortex-a57"
    }
    assert [s.cpu for s in steps[4:]] == ["cortex-a57", "neoverse-n1"] and steps[4].argv[
        -1
    ] == "actions/pins-cortex-a57.npz"
    assert len({s.slug for s in steps}) == len(steps)  # each its own log, HOME and TMPDIR


def _bundle() -> Bundle:
    return Bundle(Path("b"), {}, PolicySpec("Pendulum-v1", 3, 1, (-2.0,), (2.0,)))


def _actions(rng: np.random.Generator) -> dict[str, np.ndarray]:
    fp32 = rng.uniform(-2, 2, (256, 1)).astype(np.float32)
    qdq = (fp32 + rng.normal(0, 0.01, fp32.shape)).astype(np.float32)
    return {"fp32": fp32, "fp16": fp32.copy(), "int8 Q/DQ": qdq, "int8 integer": qdq.copy()}


def test_equal_actions_pass_with_the_gates_limits() -> None:
    x86 = _actions(np.random.default_rng(0))
    rows = {r.graph: r for r in aarch64.compare(_bundle(), x86, x86, "cortex-a57", "1.16.3")}
    assert all(r.passed and r.max_diff == 0 for r in rows.values())
    assert rows["fp32"].limit == tolerance("fp32", (-2.0,), (2.0,))
    assert rows["fp16"].limit == tolerance("fp16", (-2.0,), (2.0,))
    assert rows["int8 Q/DQ"].limit == rows["int8 integer"].limit == INT8_KERNEL_FRAC


@pytest.mark.parametrize("graph", list(aarch64.GRAPH_PRECISION))
def test_actions_past_the_gates_limit_fail(graph: str) -> None:
    x86 = _actions(np.random.default_rng(0))
    arm = dict(x86)
    span = 4.0
    # just inside and just outside the gate's limit: a max abs rule for fp, a mean fraction for int8
    inside, outside = (0.9, 1.1)
    if aarch64.GRAPH_PRECISION[graph] == "int8":
        step = INT8_KERNEL_FRAC * span
    else:
        step = tolerance(aarch64.GRAPH_PRECISION[graph], (-2.0,), (2.0,))
    for factor, passed in ((inside, True), (outside, False)):
        arm[graph] = x86[graph] + np.float32(factor * step)
        row = next(r for r in aarch64.compare(_bundle(), arm, x86, "neoverse-n1", "1.32.0") if r.graph == graph)
        assert row.passed is passed, row.line()
        assert row.line().endswith("ok" if passed else "FAILED")
        assert math.isclose(row.max_diff, factor * step, rel_tol=1e-3)


def test_a_graph_one_side_cannot_load_fails_unless_the_cpu_provider_never_serves_it() -> None:
    x86 = _actions(np.random.default_rng(0))
    arm = {k: v for k, v in x86.items() if k not in ("fp16", "int8 integer")}
    why = {"fp16": "onnxruntime 1.16.3 on aarch64: no fp16 FusedGemm kernel"}
    rows = {r.graph: r for r in aarch64.compare(_bundle(), arm, x86, "neoverse-n1", "1.16.3", why)}
    assert rows["fp16"].passed and "not compared: onnxruntime 1.16.3" in rows["fp16"].line()
    assert not rows["int8 integer"].passed and "ran on x86_64 only" in rows["int8 integer"].line()
    assert rows["fp32"].passed and rows["int8 Q/DQ"].passed


def test_actions_round_trip_without_pickle(tmp_path: Path) -> None:
    """What each side writes is read back as plain arrays (no pickle) with its versions."""
    x86 = _actions(np.random.default_rng(1))
    path = tmp_path / "a.npz"
    np.savez(path, meta=np.array('{"machine": "x86_64", "onnxruntime": "1", "unloadable": "{}"}'), **x86)
    arrays, meta = aarch64.load_actions(path)
    assert set(arrays) == set(x86) and meta["machine"] == "x86_64"
    assert all(np.array_equal(arrays[k], x86[k]) for k in x86)
