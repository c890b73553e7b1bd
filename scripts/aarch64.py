#!/usr/bin/env python3
"""``make test-aarch64``: the device runtime on 64-bit Arm, as on a Jetson, under qemu's user-mode emulation.

- An arm64 Debian root file system (bookworm, Python 3.11) made by ``mmdebstrap --variant=extract`` from the
  Debian archive apt uses on this machine (read from apt's sources at run time), cached under
  ``.cache/aarch64/``. No maintainer script runs under emulation; ``/bin/sh`` is linked by hand.
- Two installs of the device runtime in it, each the project's wheel (no torch) as ``pip install .`` would
  resolve it: with the device pins (the Makefile's ``DEVICE_PINS``) and with the newest wheels. This
  machine's pip installs PyPI's aarch64 wheels (``--platform``/``--target``) and compiles their bytecode
  (the same 3.11 magic), so pip never runs under emulation. The dependencies are cached by what they were
  resolved from (the newest ones for a day); the project itself is reinstalled every run. The pins' install
  is hash-checked (``pip --require-hashes`` on ``PINS_HASHED``, every file pip downloads for it, both
  architectures); the newest wheels cannot be (their files change with each release). The root file
  system's packages are checked by apt's own rule: mmdebstrap verifies them against the archive's signed
  ``Release`` file with the host's Debian keyring.
- Everything arm64 runs in a private mount namespace (``/proc`` with a generated arm64 ``/proc/cpuinfo``
  over the host's x86 one, which onnxruntime's cpuinfo crashes on at import; ``/sys``, ``/dev``, and the
  repository at ``/src``), chrooted, with ``QEMU_CPU`` choosing the emulated CPU: ``cortex-a57`` (no dot
  product, as Xavier's kernel reports Carmel) and ``neoverse-n1`` (dot product, like Orin's A78AE).
- Two lanes run side by side: the pins under cortex-a57 and the newest wheels under neoverse-n1, each the
  torch-free device suite, ``sac-edge run``/``bench``/``doctor`` on the bundle ``make`` exported on x86, and
  the actions of each of the bundle's graphs on its parity states under cortex-a57, neoverse-n1 and
  ``max``. Those are judged against the same graphs' actions on x86_64 (the same install for x86_64) by the
  engine parity gate's own rule (``parity_gate.judge``): fp32 and fp16 by the max abs error, int8 (the
  Q/DQ graph and the integer CPU graph) against the graph as x86 runs it.

``prepare`` installs the tools with apt-get where missing and registers qemu with binfmt_misc, saying each
step; where that cannot be done it prints one ``test-aarch64: skipped: ...`` line and exits ``SKIP``.
``prepare --no-host-setup`` (``make test HOST_SETUP=0``) changes nothing on the host and skips unless the
tools and the handler are already there. ``run`` does the rest.
``actions BUNDLE OUT`` is what each side runs to write its actions.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np

    from sac_edge.common.bundle import Bundle

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "aarch64"
SKIP = 3  # prepare's exit status when the suite cannot run here (make turns it into success)

SUITE = "bookworm"  # Debian 12: Python 3.11 (bullseye's 3.9 has no newer numpy wheels; no 3.8 for arm64)
PYTHON = "3.11"
PINS_HASHED = ROOT / "requirements" / "aarch64-pins-cp311.txt"
"""The pins lane's dependencies (the Makefile's ``DEVICE_PINS`` and what they pull in) with the sha256 of
each file, for CPython 3.11 on aarch64 and x86_64; written by ``scripts/pin_hashes.py`` (docs/TESTING.md)."""
GLIBC_MINOR = 36  # bookworm's glibc 2.36: the newest manylinux tag its wheels may carry
ROOTFS_PACKAGES = ("python3", "libstdc++6", "dash")  # the extract variant installs only what is named
APT_PACKAGES = {
    "qemu-aarch64-static": "qemu-user-static",
    "update-binfmts": "binfmt-support",
    "mmdebstrap": "mmdebstrap",
}
BINFMT = Path("/proc/sys/fs/binfmt_misc")
INSIDE = "/opt/sac-edge"  # where the installs live in the root file system
SRC = "/src"  # where the repository is mounted in it

# MIDR fields (implementer, variant, part, revision) qemu gives each model; the features come from the
# emulated CPU's HWCAPs. "max" is qemu's own (implementer 0, part 'Q').
CPU_MODELS: dict[str, tuple[int, int, int, int]] = {
    "cortex-a57": (0x41, 0x1, 0xD07, 0x1),
    "neoverse-n1": (0x41, 0x4, 0xD0C, 0x1),
    "max": (0x00, 0x0, 0x051, 0x0),
}
# Linux's names for the AT_HWCAP and AT_HWCAP2 bits (arch/arm64/include/uapi/asm/hwcap.h), as
# /proc/cpuinfo lists them.
HWCAP_NAMES = (  # noqa: SIM905 (one name per bit, in order)
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc "
    "dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg"
).split()
HWCAP2_NAMES = (  # noqa: SIM905 (one name per bit, in order)
    "dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 "
    "i8mm bf16 dgh rng bti mte ecv afp rpres mte3 sme smei16i64 smef64f64 smei8i32 smef16f32 smeb16f32 "
    "smef32f32 smefa64"
).split()


class Env(NamedTuple):
    """One install of the device runtime: ``requirements`` beside the project's wheel; ``daily``: its
    dependencies are resolved again each day (the newest wheels), else only when what they come from
    changes."""

    name: str
    requirements: tuple[str, ...]
    daily: bool
    hashed: Path | None = None
    """A ``--require-hashes`` requirements file holding every dependency (then installed from it alone)."""


class Lane(NamedTuple):
    """An install, the CPU model its device suite and CLI smoke run under, and those its actions are
    computed under."""

    env: Env
    cpu: str
    action_cpus: tuple[str, ...]


class Host(NamedTuple):
    """What decides whether the suite can run here (``skip_reason``); the later fields keep their defaults,
    which pass, until the earlier ones allow checking them."""

    machine: str
    root: bool
    debian: bool
    python: str = PYTHON  # this venv's, which runs the x86_64 side
    archive: str | None = "(not looked up yet)"
    missing: tuple[str, ...] = ()
    binfmt: str | None = None


def skip_reason(host: Host) -> str | None:
    """Why the suite cannot run on ``host``, or None."""
    if host.machine == "aarch64":
        return "this machine is aarch64 already: the device suite runs natively (make test-device)"
    if host.machine != "x86_64":
        return f"needs an x86_64 machine (this one is {host.machine})"
    if not host.root:
        return "needs root (apt-get, binfmt_misc, mounts and chroot)"
    if host.python != PYTHON:
        return (
            f"the x86_64 side runs on this venv's Python, which must be the arm64 chroot's {PYTHON} (not {host.python})"
        )
    if not host.debian:
        return "needs a Debian machine (its archive has the arm64 root file system and qemu-user-static)"
    if host.archive is None:
        return "apt's sources name no Debian archive (deb ... <suite> main)"
    if host.missing:
        return f"apt-get could not install {' '.join(host.missing)}"
    return host.binfmt


def debian_archive(sources: Iterable[tuple[str, str]]) -> str | None:
    """The first archive URI in apt's ``sources`` ((file name, text) pairs, one-line ``.list`` or deb822
    ``.sources``) that serves a release suite's ``main`` component (not -updates, -security or
    backports)."""
    for name, text in sources:
        entries: list[tuple[list[str], list[str], list[str], list[str]]] = []
        if name.endswith(".sources"):
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line or line[:1].isspace():
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                types, uris, suites, components = (
                    fields.get(k, "").split() for k in ("types", "uris", "suites", "components")
                )
                entries.append((types, uris, suites, components))
        else:
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if words[1:2] and words[1].startswith("["):  # deb [arch=... signed-by=...] URI ...
                    end = next((i for i, w in enumerate(words) if w.endswith("]")), len(words) - 1)
                    words = words[:1] + words[end + 1 :]
                if len(words) >= 4:
                    entries.append(([words[0]], [words[1]], [words[2]], words[3:]))
        for types, uris, suites, components in entries:
            release = any(s.isalpha() for s in suites)
            if "deb" in types and uris and release and "main" in components:
                return uris[0]
    return None


def apt_sources() -> list[tuple[str, str]]:
    """apt's source files on this machine, as (name, text)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    return [(p.name, p.read_text(errors="replace")) for p in files if p.is_file() and p.suffix in (".list", ".sources")]


def binfmt_problem(entry: str | None) -> str | None:
    """Why the binfmt_misc entry ``entry`` (the text of ``.../binfmt_misc/qemu-aarch64``, None when absent)
    cannot run arm64 programs in a chroot, or None. The interpreter must be opened at registration (flag F):
    the chroot holds no qemu."""
    if entry is None:
        return "binfmt_misc has no qemu-aarch64 entry and none could be registered (update-binfmts --enable)"
    lines = entry.splitlines()
    if "enabled" not in lines:
        return "binfmt_misc's qemu-aarch64 entry is disabled (update-binfmts --enable qemu-aarch64)"
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if "F" not in flags:
        return "binfmt_misc's qemu-aarch64 entry lacks the F flag (the chroot holds no qemu to open)"
    return None


def cpu_features(hwcap: int, hwcap2: int) -> list[str]:
    """/proc/cpuinfo's feature names for the AT_HWCAP and AT_HWCAP2 values."""
    names = [n for i, n in enumerate(HWCAP_NAMES) if hwcap >> i & 1]
    return names + [n for i, n in enumerate(HWCAP2_NAMES) if hwcap2 >> i & 1]


def cpuinfo(model: str, hwcap: int, hwcap2: int, cpus: int) -> str:
    """An arm64 /proc/cpuinfo, as Linux writes it, for ``cpus`` processors of the qemu CPU ``model``."""
    implementer, variant, part, revision = CPU_MODELS[model]
    block = (
        "BogoMIPS\t: 50.00\n"
        f"Features\t: {' '.join(cpu_features(hwcap, hwcap2))}\n"
        f"CPU implementer\t: 0x{implementer:02x}\n"
        "CPU architecture: 8\n"
        f"CPU variant\t: 0x{variant:x}\n"
        f"CPU part\t: 0x{part:03x}\n"
        f"CPU revision\t: {revision}\n\n"
    )
    return "".join(f"processor\t: {i}\n{block}" for i in range(cpus))


class Row(NamedTuple):
    """One graph's actions under one emulated CPU against x86_64's, with the parity gate's verdict."""

    graph: str
    cpu: str
    onnxruntime: str
    max_diff: float  # max abs difference between the two architectures' actions, env units
    rule: str
    value: float
    limit: float
    passed: bool

    def line(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        if math.isnan(self.value):
            return f"{self.graph:<13} {self.cpu:<12} onnxruntime {self.onnxruntime:<8} {self.rule}: {verdict}"
        return (
            f"{self.graph:<13} {self.cpu:<12} onnxruntime {self.onnxruntime:<8} max |diff| {self.max_diff:.3g}; "
            f"{self.rule} {self.value:.3g} vs limit {self.limit:.3g}: {verdict}"
        )


GRAPH_PRECISION = {"fp32": "fp32", "fp16": "fp16", "int8 Q/DQ": "int8", "int8 integer": "int8"}
CPU_UNSERVED = ("fp16",)  # graphs onnxruntime's CPU provider never serves: one it cannot load is no failure


def compare(
    bundle: Bundle,
    arm: Mapping[str, np.ndarray],
    x86: Mapping[str, np.ndarray],
    cpu: str,
    onnxruntime: str,
    unloadable: Mapping[str, str] | None = None,
) -> list[Row]:
    """Each graph's actions on aarch64 (``arm``) judged against the same graph's on x86_64 by the engine
    parity gate: fp32 and fp16 by their max abs tolerance; an int8 graph as the gate judges an int8 engine,
    against the graph it implements (here: itself as x86 runs it) and against x86's fp32. A graph that one
    side's onnxruntime could not load (``unloadable``: graph -> why) fails, except fp16, which onnxruntime's
    CPU provider never serves (the runtime runs it on TensorRT only)."""
    import numpy as np

    from sac_edge.edge_runtime.backends.parity_gate import judge

    unloadable = dict(unloadable or {})
    for graph in sorted(set(x86) ^ set(arm)):
        unloadable.setdefault(graph, f"ran on {'x86_64' if graph in x86 else 'aarch64'} only")
    rows = []
    for graph in GRAPH_PRECISION:
        if graph in unloadable:
            why = f"not compared: {unloadable[graph]}"
            rows.append(Row(graph, cpu, onnxruntime, math.nan, why, math.nan, math.nan, graph in CPU_UNSERVED))
            continue
        if graph not in arm:
            continue  # the bundle has no such graph
        got, same = arm[graph], x86[graph]
        precision = GRAPH_PRECISION[graph]
        backend, when, source = f"onnxruntime-cpu/{cpu}", "aarch64 vs x86_64", "parity states"
        if precision == "int8":
            verdict = judge(got, x86["fp32"], bundle, backend, precision, when, source, implements=same)
        else:
            verdict = judge(got, same, bundle, backend, precision, when, source)
        diff = np.abs(got.astype(np.float64) - same.astype(np.float64))
        max_diff = float(diff.max()) if np.all(np.isfinite(diff)) else math.inf
        rows.append(Row(graph, cpu, onnxruntime, max_diff, verdict.rule, verdict.value, verdict.limit, verdict.passed))
    return rows


def verified_bundle(path: Path) -> Bundle:
    """The bundle at ``path`` as the runtime opens it (every file's checksum verified)."""
    from sac_edge.common.bundle import open_bundle

    return open_bundle(path)


def dump_actions(bundle_dir: Path, out: Path) -> None:
    """Write the actions of each of the bundle's graphs on its parity states, and the versions that computed
    them, to ``out`` (.npz)."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from sac_edge.calibration.session import OnnxPolicy
    from sac_edge.common.errors import SacEdgeError
    from sac_edge.edge_runtime.backends.parity_gate import gate_states

    bundle = verified_bundle(bundle_dir)
    states, _ = gate_states(bundle)
    integer = bundle.files("onnx-cpu", "int8")
    graphs = {
        "fp32": bundle.onnx("fp32"),
        "fp16": bundle.onnx("fp16"),
        "int8 Q/DQ": bundle.onnx("int8"),
        "int8 integer": bundle.path / integer[0] if integer else None,
    }
    arrays: dict[str, Any] = {}
    unloadable = {}
    for graph, path in graphs.items():
        if path is None:
            continue
        try:
            policy = OnnxPolicy(onnx.load_from_string(bundle.read(path)))
        except SacEdgeError as err:  # one line naming what onnxruntime's CPU provider lacks
            unloadable[graph] = f"onnxruntime {ort.__version__} on {platform.machine()}: {str(err)[:200]}"
            continue
        arrays[graph] = policy(states)
    meta = {"machine": platform.machine(), "onnxruntime": ort.__version__, "numpy": np.__version__}
    meta["unloadable"] = json.dumps(unloadable)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
    print(
        f"{', '.join(arrays)} on {len(states)} states ({meta['machine']}, onnxruntime {meta['onnxruntime']}) -> {out}"
    )


def load_actions(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """What ``dump_actions`` wrote: the actions per graph and the versions."""
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    return arrays, meta


# --- the host side ------------------------------------------------------------------------------------


HOST_SETUP_0 = " (make test HOST_SETUP=0 skips it)"
"""Said with each change to the host, before it is made."""


def say(message: str) -> None:
    print(f"test-aarch64: {message}", flush=True)


def run(argv: Sequence[str], log: Path | None = None, env: Mapping[str, str] | None = None) -> None:
    """Run ``argv``; output to ``log`` when given (its tail is shown on failure); exit 1 on failure."""
    if log is None:
        proc = subprocess.run(list(argv), check=False, env=env)
    else:
        with open(log, "ab") as f:
            proc = subprocess.run(list(argv), stdout=f, stderr=subprocess.STDOUT, check=False, env=env)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) + "\n" if log else ""
        sys.stderr.write(tail)
        raise SystemExit(f"test-aarch64: {shlex.join(argv[:4])} ... failed (exit {proc.returncode})")


def _os_id() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    return next((line.split("=", 1)[1].strip('"') for line in text.splitlines() if line.startswith("ID=")), "")


def _install_tools() -> tuple[str, ...]:
    """apt-get the missing tools (updating the package lists once when the first try fails); what is still
    missing after."""

    def missing() -> list[str]:
        return [pkg for tool, pkg in APT_PACKAGES.items() if shutil.which(tool) is None]

    for attempt in ("install", "update"):
        if not missing():
            break
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if attempt == "update":
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, check=False, env=env)
        say(f"host set-up{HOST_SETUP_0}: apt-get install {' '.join(missing())}")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing()],
            capture_output=True, check=False, env=env,
        )  # fmt: skip
    return tuple(missing())


def _register_binfmt(setup: bool = True) -> str | None:
    """Mount binfmt_misc and enable qemu-aarch64 where needed (only with ``setup``); why arm64 programs
    cannot run, or None."""
    if setup and not (BINFMT / "register").exists():
        say(f"host set-up{HOST_SETUP_0}: mount -t binfmt_misc binfmt_misc {BINFMT}")
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, check=False)
    entry = BINFMT / "qemu-aarch64"
    if setup and not entry.exists() and (BINFMT / "register").exists():
        say(
            f"host set-up{HOST_SETUP_0}: update-binfmts --enable qemu-aarch64 (this machine then runs arm64 programs "
            "through qemu)"
        )
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], capture_output=True, check=False)
    try:
        return binfmt_problem(entry.read_text())
    except OSError:
        return binfmt_problem(None)


def prepare(setup: bool = True) -> int:
    """Make this machine able to run the suite; SKIP with one line saying why where it cannot. Without
    ``setup`` (``make test HOST_SETUP=0``) nothing is installed, mounted or enabled: the suite runs only
    where the tools and the binfmt handler are already there."""
    python = ".".join(platform.python_version_tuple()[:2])
    host = Host(platform.machine(), os.geteuid() == 0, _os_id() == "debian", python)
    if skip_reason(host) is None:
        host = host._replace(archive=debian_archive(apt_sources()))
    if skip_reason(host) is None:
        missing = tuple(pkg for tool, pkg in APT_PACKAGES.items() if shutil.which(tool) is None)
        host = host._replace(missing=_install_tools() if setup else missing)
    if skip_reason(host) is None:
        host = host._replace(binfmt=_register_binfmt(setup))
    reason = skip_reason(host)
    if reason is not None and not setup and host.missing:
        reason = f"needs {' '.join(host.missing)}"
    if reason is not None:
        say(f"skipped: {reason}" + ("" if setup else " (HOST_SETUP=0: nothing was installed or enabled)"))
        return SKIP
    return 0


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_rootfs(archive: str) -> Path:
    """The arm64 root file system, built once per package list into the cache (atomically: a build cut
    short is never reused)."""
    path = CACHE / f"rootfs-{SUITE}-{_key(SUITE, ROOTFS_PACKAGES)}"
    if (path / ".complete").exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    say(f"building the arm64 {SUITE} root file system ({', '.join(ROOTFS_PACKAGES)})")
    run(
        ["mmdebstrap", "--quiet", "--variant=extract", "--arch=arm64", f"--include={','.join(ROOTFS_PACKAGES)}",
         SUITE, str(tmp), archive],
        log=CACHE / "mmdebstrap.log",
    )  # fmt: skip
    if not (tmp / "bin" / "sh").exists():
        (tmp / "bin" / "sh").symlink_to("dash")  # dash's maintainer script would have made it
    for name in ("proc", "sys", "dev", SRC.strip("/"), "tmp"):
        (tmp / name).mkdir(exist_ok=True)
    (tmp / "tmp").chmod(0o1777)
    (tmp / ".complete").touch()
    for old in CACHE.glob(f"rootfs-{SUITE}-*"):  # built from another package list, or cut short
        if old != tmp:
            shutil.rmtree(old, ignore_errors=True)
    tmp.rename(path)
    return path


def build_wheel(work: Path) -> Path:
    """The project's wheel, built here from the working tree."""
    out = work / "wheel"
    shutil.rmtree(out, ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        log=work / "wheel.log")  # fmt: skip
    return next(out.glob("sac_edge-*.whl"))


def requires_dist(wheel: Path) -> list[str]:
    """The wheel's own requirements (its METADATA's Requires-Dist without extras)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def platform_options(arch: str) -> list[str]:
    """pip's options for CPython 3.11 wheels of ``arch`` ("aarch64"; "" for this machine's own)."""
    if not arch:
        return []
    tags = ["manylinux2014_" + arch] + [f"manylinux_2_{m}_{arch}" for m in range(17, GLIBC_MINOR + 1)]
    abi = "cp" + PYTHON.replace(".", "")
    return [f"--platform={t}" for t in tags] + [
        "--python-version",
        PYTHON,
        "--implementation",
        "cp",
        "--abi",
        abi,
        "--only-binary=:all:",
    ]


def check_hashed(pins: Sequence[str], hashed: Path) -> Path:
    """``hashed``, once each of ``pins`` is in it at that version (else the pins changed without it)."""
    lines = {line.split(" ", 1)[0].lower() for line in hashed.read_text().splitlines() if "==" in line}
    stale = [pin for pin in pins if pin.lower() not in lines]
    if stale:
        raise SystemExit(
            f"test-aarch64: {hashed.relative_to(ROOT)} lacks {', '.join(stale)}; regenerate it as docs/TESTING.md "
            'says ("Downloads pinned by hash")'
        )
    return hashed


def pip_install(site: Path, packages: Sequence[str], arch: str, log: Path, *extra: str) -> None:
    """This machine's pip installs ``packages`` into ``site`` for ``arch``."""
    run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-warn-conflicts", "--disable-pip-version-check",
         "--cache-dir", str(CACHE / "pip"), "--target", str(site), *platform_options(arch), *extra, *packages],
        log=log,
    )  # fmt: skip


def install(place: Path, env: Env, wheel: Path, arch: str, today: str, work: Path) -> Path:
    """The ``env`` install at ``place`` (a venv layout; its dependencies cached by what they were resolved
    from) with this run's project; its site-packages."""
    site = place / "lib" / f"python{PYTHON}" / "site-packages"
    log = work / f"pip-{env.name}-{arch or 'x86_64'}.log"
    hashed = env.hashed.read_text() if env.hashed else ""
    key = _key(env.requirements, requires_dist(wheel), platform_options(arch), today if env.daily else "", hashed)
    stamp = place / ".deps-key"
    if not stamp.exists() or stamp.read_text() != key:
        shutil.rmtree(place, ignore_errors=True)
        if env.hashed:  # every file checked against its sha256; the project's wheel comes below, --no-deps
            pip_install(site, ["--require-hashes", "--no-deps", "-r", str(env.hashed)], arch, log)
        else:
            pip_install(site, [str(wheel), *env.requirements], arch, log)
        run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(site)], log=log)
        stamp.write_text(key)
    pip_install(site, [str(wheel)], "", log, "--no-deps", "--upgrade")
    run([sys.executable, "-m", "compileall", "-q", str(site / "sac_edge")], log=log)
    if (site / "torch").exists():
        raise SystemExit(f"test-aarch64: torch got installed in the {env.name} device install ({site})")
    return site


def venv_layout(place: Path, site: Path) -> None:
    """Make ``place`` (as seen from the chroot, ``INSIDE/<name>``) a venv over the chroot's Python: its
    pyvenv.cfg, ``bin/python3`` and the console scripts pip wrote for ``site``, pointed at it."""
    inside = f"{INSIDE}/{place.name}"
    (place / "pyvenv.cfg").write_text(f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {PYTHON}\n")
    bindir = place / "bin"
    bindir.mkdir(exist_ok=True)
    for name, target in (("python3", f"/usr/bin/python{PYTHON}"), ("python", "python3")):
        if not (bindir / name).is_symlink():
            (bindir / name).symlink_to(target)
    for script in sorted((site / "bin").iterdir()):
        lines = script.read_text().splitlines(keepends=True)
        if lines and lines[0].startswith("#!") and "python" in lines[0]:
            (bindir / script.name).write_text(f"#!{inside}/bin/python3\n" + "".join(lines[1:]))
            (bindir / script.name).chmod(0o755)


def chrooted(
    rootfs: Path, cpu: str, argv: Sequence[str], cwd: str, cpuinfo_file: Path | None, env: Mapping[str, str]
) -> list[str]:
    """The command that runs ``argv`` (arm64, found in the chroot) under the qemu CPU ``cpu`` in ``cwd``
    inside the chroot, in a private mount namespace (gone with the command: nothing stays mounted)."""
    q = shlex.quote
    mounts = [
        f"mount -t proc proc {q(str(rootfs / 'proc'))}",
        f"mount --rbind /sys {q(str(rootfs / 'sys'))}",
        f"mount --rbind /dev {q(str(rootfs / 'dev'))}",
        f"mount --bind {q(str(ROOT))} {q(str(rootfs / SRC.strip('/')))}",
    ]
    if cpuinfo_file is not None:
        mounts.insert(1, f"mount --bind {q(str(cpuinfo_file))} {q(str(rootfs / 'proc' / 'cpuinfo'))}")
    variables = [f"{k}={v}" for k, v in {"QEMU_CPU": cpu, "LANG": "C.UTF-8", **env}.items()]
    inner = f"cd {q(cwd)} && exec {shlex.join(argv)}"
    chroot = shlex.join(
        ["env", "-i", *variables, shutil.which("chroot") or "chroot", str(rootfs), "/bin/sh", "-c", inner]
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", " && ".join([*mounts, f"exec {chroot}"])]


def probe_cpuinfo(rootfs: Path, cpu: str) -> Path:
    """Generate /proc/cpuinfo for ``cpu`` from the HWCAPs the emulated CPU reports."""
    code = "import ctypes; f = ctypes.CDLL(None).getauxval; f.restype = ctypes.c_ulong; print(f(16), f(26))"
    cmd = chrooted(rootfs, cpu, [f"/usr/bin/python{PYTHON}", "-c", code], "/", None, {})
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"test-aarch64: the arm64 Python does not start under qemu ({out.stderr.strip()[-200:]})")
    hwcap, hwcap2 = (int(x) for x in out.stdout.split())
    path = CACHE / f"cpuinfo-{cpu}"
    path.write_text(cpuinfo(cpu, hwcap, hwcap2, os.cpu_count() or 1))
    return path


# the Makefile's device-suite smoke
RUN_FLAGS = ("--duration", "2", "--rate-hz", "100", "--json")
BENCH_FLAGS = ("--batch", "1,8", "--calls", "100", "--json")


class Step(NamedTuple):
    """One command run under emulation: with which install, under which CPU model, in which folder."""

    env: str
    what: str
    cpu: str
    argv: list[str]
    cwd: str

    @property
    def slug(self) -> str:
        return f"{self.env}-{self.what.replace(' ', '-')}"


def lane_steps(lane: Lane, work_inside: str, tests: Sequence[str]) -> list[Step]:
    """A lane's steps: the device suite and the CLI smoke under its CPU, then the actions under each of its
    action CPUs."""
    name, cpu, bundle = lane.env.name, lane.cpu, "bundle"
    pytest = ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    steps = [
        Step(name, "device suite", cpu, pytest, f"{SRC}/tests"),
        Step(name, "sac-edge run", cpu, ["sac-edge", "run", bundle, *RUN_FLAGS], work_inside),
        Step(name, "sac-edge bench", cpu, ["sac-edge", "bench", bundle, *BENCH_FLAGS], work_inside),
        Step(name, "sac-edge doctor", cpu, ["sac-edge", "doctor", bundle], work_inside),
    ]
    for model in lane.action_cpus:
        argv = ["python3", f"{SRC}/scripts/aarch64.py", "actions", bundle, f"actions/{name}-{model}.npz"]
        steps.append(Step(name, f"actions {model}", model, argv, work_inside))
    return steps


def run_step(rootfs: Path, step: Step, work: Path, cpuinfos: Mapping[str, Path]) -> str:
    """Run one step in the chroot (its own HOME and TMPDIR); its report: its time and the last line of its
    output, or, when it failed (the report starts FAILED), the tail of its output."""
    tmp = f"/tmp/{step.slug}"
    (rootfs / tmp.strip("/") / "home").mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{INSIDE}/{step.env}/bin:/usr/bin:/bin",
        "HOME": f"{tmp}/home",
        "TMPDIR": tmp,
        "SAC_EDGE_TEST_BUNDLES": f"{SRC}/{work.relative_to(ROOT)}/bundles",
    }
    log = work / f"{step.slug}.log"
    start = time.monotonic()
    with open(log, "wb") as f:
        cmd = chrooted(rootfs, step.cpu, step.argv, step.cwd, cpuinfos[step.cpu], env)
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False).returncode
    lines = log.read_text(errors="replace").strip().splitlines() or [""]
    head = f"[{step.env} / {step.cpu}] {step.what} ({time.monotonic() - start:.0f} s)"
    if rc != 0:
        return f"FAILED {head}, exit {rc}, {log}:\n" + "\n".join(lines[-30:])
    return f"{head}: {lines[-1][:300]}"


def x86_actions(site: Path, bundle: Path, out: Path, log: Path) -> None:
    """The actions on this machine, from the x86_64 copy of an install (the same pins; no site-packages of the venv)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    run([sys.executable, "-S", str(Path(__file__).resolve()), "actions", str(bundle), str(out)], log=log, env=env)


def run_all(work: Path, pins: Sequence[str], tests: Sequence[str]) -> int:
    """Everything after ``prepare``; exit status."""
    start = time.monotonic()
    work = work.resolve()
    archive = debian_archive(apt_sources())
    if archive is None:
        raise SystemExit("test-aarch64: apt's sources name no Debian archive; run `scripts/aarch64.py prepare`")
    rootfs = build_rootfs(archive)
    extras = ("pytest", "pytest-timeout")
    pinned = tuple(pins) + tuple(e for e in extras if not any(p.startswith(e + "==") for p in pins))
    hashed = check_hashed(pinned, PINS_HASHED) if all("==" in pin for pin in pinned) else None
    # qemu's "max" (every feature it emulates, SVE included) for the newest onnxruntime, whose kernels may
    # use them
    lanes = (
        Lane(Env("pins", pinned, False, hashed), "cortex-a57", ("cortex-a57", "neoverse-n1")),
        Lane(Env("newest", extras, True), "neoverse-n1", ("cortex-a57", "neoverse-n1", "max")),
    )
    wheel = build_wheel(work)
    today = datetime.date.today().isoformat()
    say(f"installing the device runtime ({', '.join(lane.env.name for lane in lanes)}) for aarch64 and x86_64")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = {
            (lane.env.name, arch): pool.submit(install, place, lane.env, wheel, arch, today, work)
            for lane in lanes
            for arch, place in (
                ("aarch64", rootfs / INSIDE.strip("/") / lane.env.name),
                ("", CACHE / "x86_64" / lane.env.name),
            )
        }
        sites = {key: job.result() for key, job in jobs.items()}
    for lane in lanes:
        venv_layout(rootfs / INSIDE.strip("/") / lane.env.name, sites[(lane.env.name, "aarch64")])
    cpuinfos = {cpu: probe_cpuinfo(rootfs, cpu) for cpu in CPU_MODELS}
    say(f"ready in {time.monotonic() - start:.0f} s")
    bundle = work / "bundle"
    shutil.rmtree(rootfs / "tmp", ignore_errors=True)  # the last run's test folders
    (rootfs / "tmp").mkdir()
    (rootfs / "tmp").chmod(0o1777)
    work_inside = f"{SRC}/{work.relative_to(ROOT)}"
    steps = [step for lane in lanes for step in lane_steps(lane, work_inside, tests)]
    # the device suites first, the slowest (the newest wheels) first: the short steps then fill both cores
    steps.sort(key=lambda step: (step.what != "device suite", step.env != lanes[-1].env.name))
    workers = max(2, os.cpu_count() or 2)
    say(f"running {len(steps)} steps under emulation, {workers} at a time")
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        step_jobs = [pool.submit(run_step, rootfs, step, work, cpuinfos) for step in steps]
        for lane in lanes:
            x86_actions(
                sites[(lane.env.name, "")], bundle, work / "actions" / f"{lane.env.name}-x86_64.npz", work / "x86.log"
            )
        reports = [job.result() for job in step_jobs]
    print("\n".join(reports))
    failed = [line for line in reports if line.startswith("FAILED")]
    if not failed:
        failed += [row.line() for row in judge_actions(bundle, work / "actions", lanes)]
        failed = [line for line in failed if line.endswith("FAILED")]
    verdict = f"{len(failed)} FAILED" if failed else "passed"
    say(f"{verdict} in {time.monotonic() - start:.0f} s (after the bundles were exported)")
    return 1 if failed else 0


def judge_actions(bundle_dir: Path, actions: Path, lanes: Sequence[Lane]) -> list[Row]:
    """Every aarch64 actions file against its install's x86_64 one; prints the table."""
    bundle = verified_bundle(bundle_dir)
    rows = []
    for lane in lanes:
        name = lane.env.name
        x86, x86_meta = load_actions(actions / f"{name}-x86_64.npz")
        for cpu in lane.action_cpus:
            arm, meta = load_actions(actions / f"{name}-{cpu}.npz")
            if meta["machine"] != "aarch64" or meta["onnxruntime"] != x86_meta["onnxruntime"]:
                raise SystemExit(f"test-aarch64: {name}-{cpu}: {meta} is not the aarch64 run of x86's {x86_meta}")
            unloadable = {**json.loads(x86_meta["unloadable"]), **json.loads(meta["unloadable"])}
            rows += compare(bundle, arm, x86, cpu, meta["onnxruntime"], unloadable)
    print("actions on the parity states, aarch64 (qemu CPU model) against x86_64, same onnxruntime:")
    print("\n".join(row.line() for row in rows))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    ready = sub.add_parser("prepare", help="install the tools and register qemu; exit 3 with the reason when it cannot")
    ready.add_argument(
        "--no-host-setup", action="store_true", help="install, mount and enable nothing; skip unless all is there"
    )
    go = sub.add_parser("run", help="build, install and run everything (after prepare)")
    go.add_argument("--work", type=Path, required=True, help="folder under the repository with bundle/ and bundles/")
    go.add_argument("--pins", default="", help="the device pins (space separated)")
    go.add_argument("--tests", default="", help="the device suite's test paths under tests/ (space separated)")
    acts = sub.add_parser("actions", help="write the actions of a bundle's graphs on its parity states")
    acts.add_argument("bundle", type=Path)
    acts.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(setup=not args.no_host_setup)
    if args.command == "actions":
        dump_actions(args.bundle, args.out)
        return 0
    return run_all(args.work, args.pins.split(), args.tests.split())


if __name__ == "__main__":
    sys.exit(main())
