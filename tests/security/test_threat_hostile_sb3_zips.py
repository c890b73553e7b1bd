"""Threat: a Stable-Baselines3 ``.zip`` from elsewhere (``sac-export MODEL.zip``), damaged or made to hurt.

What it may make the reader allocate is bounded before anything is built: a stride-0 view or one tensor
under thousands of names (the tensors' total by their shapes against the bytes the file holds), a stream
of pickle opcodes (a count), a ``data`` entry of millions of JSON values (a count); each was a zip under
80 KiB driving sac-export past 1 GiB. Every damaged zip (each class found by fuzzing the reader, or by
hand) is one line, exit 2, never "internal error"; a policy whose weights or entropy coefficient are not
finite is refused at export instead of failing on the robot.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_zips import (
    FLAGS,
    METHOD,
    VERSION_NEEDED,
    members,
    patch_central,
    rezip,
    saved,
    torch_records,
    with_state,
    zipped,
)

from sac_edge.common.errors import SacEdgeError
from sac_edge.export.cli import main as export_main
from sac_edge.export.pickle_data import MAX_OPCODES
from sac_edge.export.source import load_source

pytest.importorskip("stable_baselines3")
pytestmark = pytest.mark.torch

Maker = Callable[[Path, Path], Path]  # (the clean zip, where to write) -> the hostile zip


# -- zips that would allocate gigabytes ----------------------------------------------------------------------
def _stride_zero(src: Path, dst: Path) -> Path:
    """One float stored, viewed as 20000 x 20000 (torch.save keeps the view: 1.6 GB when copied out)."""
    return with_state(src, dst, lambda sd: sd.update({"actor.mu.weight": torch.zeros(1).expand(20_000, 20_000)}))


def _aliased(src: Path, dst: Path) -> Path:
    """One 256 KiB tensor under 4,000 names (1 GiB when each is built)."""
    shared = torch.zeros(256, 256)
    return with_state(src, dst, lambda sd: sd.update({f"actor.alias.{i}": shared for i in range(4000)}))


def _opcode_stream(src: Path, dst: Path) -> Path:
    """policy.pth's data.pkl: 16 Mi EMPTY_LIST opcodes (16 MiB deflating to 16 KiB; 900 MiB of lists)."""
    records = torch_records(members(src)["policy.pth"])
    pkl = next(name for name in records if name.endswith("/data.pkl"))
    records[pkl] = b"\x80\x02" + b"]" * (16 << 20) + b"."
    return rezip(src, dst, policy_pth=zipped(records, compression=0))


def _json_values(src: Path, dst: Path) -> Path:
    """A ``data`` entry of 5 million empty lists (15 MiB deflating to 15 KiB; 400 MiB parsed)."""
    return rezip(src, dst, data=b"[" + b"[]," * (5 << 20) + b"0]")


ALLOCATING: dict[str, tuple[Maker, str]] = {
    "stride-0 view": (_stride_zero, "tensors take 1600000"),
    "one tensor under 4,000 names": (_aliased, "4022 tensors take"),
    "16 Mi pickle opcodes": (_opcode_stream, f"more than {MAX_OPCODES} opcodes"),
    "5 million JSON values": (_json_values, "JSON values, more than 65536"),
}


@pytest.mark.parametrize("case", list(ALLOCATING))
def test_a_small_zip_that_would_allocate_gigabytes_is_refused(
    case: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    make, says = ALLOCATING[case]
    assert make(sb3_zip, tmp_path / "size.zip").stat().st_size < 80 << 10
    err = _export_refused(make, sb3_zip, tmp_path, refused)
    assert says in err, err


def test_what_the_reader_allocates_is_bounded(sb3_zip: Path, tmp_path: Path) -> None:
    """In a child process, so its peak memory is its own (``VmHWM``: ``ru_maxrss`` would carry over the
    parent's peak through exec): reading all four zips grows the peak by less than 250 MiB over reading the
    clean one; before the bounds, the first alone took 1.6 GiB."""
    paths = [str(make(sb3_zip, tmp_path / f"{i}.zip")) for i, (make, _) in enumerate(ALLOCATING.values())]
    code = (
        "import re, sys\nfrom pathlib import Path\nfrom sac_edge.common.errors import SacEdgeError\n"
        "from sac_edge.export.sb3 import load_sb3_zip\n"
        "peak = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text())[1])\n"
        "load_sb3_zip(Path(sys.argv[1])); base = peak()\n"
        "for path in sys.argv[2:]:\n"
        "    try:\n        load_sb3_zip(Path(path))\n    except SacEdgeError:\n        pass\n"
        "print((peak() - base) >> 10)\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(sb3_zip), *paths], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr[-500:]
    assert int(child.stdout.strip()) < 250, f"the peak grew by {child.stdout.strip()} MiB"


# -- damaged zips: each class of exception that escaped as "internal error" ------------------------------------
def _policy_pth(change: Callable[[bytes], bytes]) -> Maker:
    return lambda src, dst: rezip(src, dst, policy_pth=change(members(src)["policy.pth"]))


def _outer(change: Callable[[Path], bytes]) -> Maker:
    """A zip made of the clean one's path by ``change`` (its bytes patched, or its members zipped again)."""

    def write(src: Path, dst: Path) -> Path:
        dst.write_bytes(change(src))
        return dst

    return write


def _non_utf8_name(files: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    """A zip of ``files`` and a member whose name is flagged UTF-8 but is not (``é`` -> ``\\xc3(``)."""
    return zipped({**files, "extra-é": b""}, compression).replace(b"extra-\xc3\xa9", b"extra-\xc3(")


def _state(change: Callable[[dict[str, torch.Tensor]], object]) -> Maker:
    return lambda src, dst: with_state(src, dst, change)


def _data(change: Callable[[dict], object]) -> Maker:
    def write(src: Path, dst: Path) -> Path:
        data = json.loads(members(src)["data"])
        change(data)
        return rezip(src, dst, data=json.dumps(data).encode())

    return write


def _variables(tensors: dict[str, torch.Tensor]) -> Maker:
    return lambda src, dst: rezip(src, dst, pytorch_variables_pth=saved(tensors))


#: Each damaged zip and what its one line says; before, each ended in exit 1 "internal error" (but the integer
#: tensor, exported as if it were float).
DAMAGED: dict[str, tuple[Maker, str]] = {
    # zipfile's own exceptions besides BadZipFile, in the SB3 zip and in the torch.save zip inside it
    "a record 5 bytes shorter than its headers say (negative seek)": (
        _policy_pth(lambda raw: raw[:200] + raw[205:]),
        "policy.pth is corrupt or not a plain tensor file (negative seek value -5)",
    ),
    "a torch.save record name that is not UTF-8": (
        _policy_pth(lambda raw: _non_utf8_name(torch_records(raw), zipfile.ZIP_STORED)),
        "policy.pth is not in torch's zip format",
    ),
    "an SB3 member name that is not UTF-8": (
        _outer(lambda src: _non_utf8_name(members(src))),
        "corrupt or truncated Stable-Baselines3 zip ('utf-8' codec",
    ),
    "an unknown compression method": (
        _outer(lambda src: patch_central(src.read_bytes(), "data", METHOD, 99)),
        "compression method is not supported",
    ),
    "a zip version from the future": (
        _outer(lambda src: patch_central(src.read_bytes(), "data", VERSION_NEEDED, 84)),
        "zip file version 8.4",
    ),
    "an encrypted member": (_outer(lambda src: patch_central(src.read_bytes(), "data", FLAGS, 1)), "is encrypted"),
    # state dicts whose shapes do not chain: torch's stack, SB3's load_state_dict, int() of a layer name
    "critics of different input widths": (
        _state(lambda sd: sd.update({"critic.qf1.0.weight": torch.zeros(8, 5)})),
        "critic.qf1.0 has weight and bias of shapes ((8, 5), (8,))",
    ),
    "a bias of the wrong size": (
        _state(lambda sd: sd.update({"critic.qf0.0.bias": torch.zeros(3)})),
        "critic.qf0.0 has weight and bias of shapes ((8, 4), (3,))",
    ),
    "a target critic missing": (
        _state(lambda sd: [sd.pop(k) for k in list(sd) if k.startswith("critic_target.qf1.")]),
        "different numbers of Q-networks",
    ),
    "a tensor SB3's policy has not": (_state(lambda sd: sd.update({"actor.extra": torch.zeros(1)})), "'actor.extra'"),
    "a layer index that is not a number": (
        _state(lambda sd: sd.update({"critic.qf0.x.weight": torch.zeros(1)})),
        "holds 'critic.qf0.x.weight', which SB3's SAC MlpPolicy has not",
    ),
    "an integer tensor": (
        _state(lambda sd: sd.update({"actor.mu.bias": torch.zeros(1, dtype=torch.int64)})),
        "actor.mu.bias is not floating point",
    ),
    "log_ent_coef of two values": (_variables({"log_ent_coef": torch.zeros(2)}), "log_ent_coef is not one number"),
    # the recorded spaces: a low bound above the high one, a range past float32; JSON past int()'s limit
    "an observation low above its high": (
        _data(lambda d: d["observation_space"].update(low="[-2. -2. -2.]", high="[ 1. 1. -1e300]")),
        "low bound above its high bound (or NaN) in dimensions [2]",
    ),
    "action bounds whose range overflows float32": (
        _data(lambda d: d["action_space"].update(low="[-3e38]", high="[3e38]")),
        "unbounded in dimensions [0] (or its range overflows float32)",
    ),
    "a 5,000-digit number in data": (
        lambda src, dst: rezip(src, dst, data=b'{"n": ' + b"7" * 5000 + b"}"),
        "data entry is not JSON",
    ),
}


def _export_refused(make: Maker, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]) -> str:
    """The one line sac-export refuses ``make``'s zip with (exit 2, no bundle)."""
    hostile = make(sb3_zip, tmp_path / "hostile.zip")
    out = tmp_path / "bundle"
    err = refused(export_main, [str(hostile), "--out", str(out)], prog="sac-export")
    assert str(hostile) in err and not out.exists(), err
    return err


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_zip_is_one_line(case: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    make, says = DAMAGED[case]
    err = _export_refused(make, sb3_zip, tmp_path, refused)
    assert says in err, err


def _mutant(rng: random.Random, files: dict[str, bytes]) -> bytes:
    """The clean zip with a few bytes of one record of policy.pth or pytorch_variables.pth, of the ``data``
    entry, or of the zip itself, changed (the fuzzer that found the classes above)."""
    files = dict(files)
    where = rng.choice(["policy.pth", "policy.pth", "pytorch_variables.pth", "data", "zip"])
    if where.endswith(".pth"):
        records = torch_records(files[where])
        name = rng.choice([n for n in records if n.endswith(("data.pkl", "/0", "/1", "/2"))] or list(records))
        records[name] = _flip(rng, records[name])
        files[where] = zipped(records, compression=0)
    elif where == "data":
        files["data"] = _flip(rng, files["data"])
    raw = zipped(files)
    return _flip(rng, raw) if where == "zip" else raw


def _flip(rng: random.Random, raw: bytes) -> bytes:
    out = bytearray(raw)
    for _ in range(rng.choice([1, 2, 4])):
        if not out:
            break
        at = rng.randrange(len(out))
        if rng.random() < 0.5:
            out[at] = rng.randrange(256)
        else:
            out[at : at + rng.randrange(1, 8)] = b""
    return bytes(out)


def test_fuzzed_zips_load_or_are_refused_in_one_line(sb3_zip: Path, tmp_path: Path) -> None:
    """300 seeded mutants: each loads into a policy that acts as SB3's predict does, or is a SacEdgeError."""
    rng, files, loaded = random.Random(49), members(sb3_zip), 0
    obs = np.random.default_rng(0).uniform(-1, 1, (4, 3)).astype(np.float32)
    for i in range(300):
        path = tmp_path / "mutant.zip"
        path.write_bytes(_mutant(rng, files))
        try:
            source = load_source(str(path))
        except SacEdgeError:
            continue
        except Exception as err:  # the failure is the mutant's number: rerun it with this seed to see it
            raise AssertionError(f"mutant {i}: {type(err).__name__}: {err}") from None
        with torch.inference_mode():
            got = source.policy(torch.as_tensor(obs)).numpy()
        np.testing.assert_allclose(got, source.reference(obs), atol=1e-5, err_msg=f"mutant {i}")
        loaded += 1
    assert 0 < loaded < 300


# -- values that are not finite: refused at export, not discovered by fine-tuning on the robot --------------------
def _vecnormalize(tmp_path: Path, **kwargs: float) -> Path:
    """A VecNormalize file SB3 writes for Pendulum-v1 with ``kwargs`` (``epsilon=...``)."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")]), **kwargs)
    venv.reset()
    for _ in range(10):
        venv.step(np.array([venv.action_space.sample()]))
    path = tmp_path / "vecnormalize.pkl"
    venv.save(path)
    return path


@pytest.mark.filterwarnings("ignore:invalid value encountered in sqrt:RuntimeWarning")  # SB3's own, at -1
@pytest.mark.parametrize(
    ("epsilon", "says"),
    [
        (float("inf"), "epsilon is inf, not a finite number >= 0"),
        (float("nan"), "epsilon is nan"),
        (-1.0, "epsilon is -1.0"),
        (1e90, "1/sqrt(var + epsilon) is 1.4e-45 in float32"),
    ],
    ids=["inf", "nan", "negative", "past-float32"],
)
def test_a_vecnormalize_epsilon_that_makes_one_action_for_every_state_is_refused(
    epsilon: float, says: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    stats = _vecnormalize(tmp_path, epsilon=epsilon)
    out = tmp_path / "b"
    err = refused(export_main, [str(sb3_zip), "--vecnormalize", str(stats), "--out", str(out)], prog="sac-export")
    assert says in err and "VecNormalize" in err, err
    assert not out.exists()


def _fixed_ent_coef(value: object) -> Maker:
    """The zip with alpha fixed at ``value`` (``data['ent_coef']``, no learned ``log_ent_coef``)."""

    def write(src: Path, dst: Path) -> Path:
        data = json.loads(members(src)["data"])
        data["ent_coef"] = value
        return rezip(src, dst, data=json.dumps(data).encode(), pytorch_variables_pth=None)

    return write


def _nan_at(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(sd: dict[str, torch.Tensor]) -> None:
        sd[name] = sd[name].clone()
        sd[name].view(-1)[0] = float("nan")

    return change


#: Before, each exported cleanly (NaN critics, alpha) or ended in exit 1 (a NaN actor: SB3's predict raised).
NOT_FINITE: dict[str, tuple[Maker, str]] = {
    "a NaN critic weight": (_state(_nan_at("critic.qf1.0.weight")), "critic.qf1.0.weight holds NaN"),
    "a NaN target critic": (_state(_nan_at("critic_target.qf0.2.bias")), "critic_target.qf0.2.bias holds NaN"),
    "a NaN actor weight": (_state(_nan_at("actor.mu.weight")), "actor.mu.weight holds NaN"),
    "an actor weight past float32": (
        _state(lambda sd: sd.update({"actor.mu.bias": torch.full((1,), 1e300, dtype=torch.float64)})),
        "actor.mu.bias holds NaN or values infinite in float32",
    ),
    'ent_coef "nan"': (_fixed_ent_coef("nan"), "ent_coef as a positive finite number: the zip has 'nan'"),
    "ent_coef Infinity": (_fixed_ent_coef(float("inf")), "the zip has 'inf'"),
    "a NaN log_ent_coef": (_variables({"log_ent_coef": torch.tensor([np.nan])}), "(log_ent_coef nan) is not finite"),
}


@pytest.mark.parametrize("case", list(NOT_FINITE))
def test_a_policy_that_is_not_finite_is_refused_at_export(
    case: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    make, says = NOT_FINITE[case]
    err = _export_refused(make, sb3_zip, tmp_path, refused)
    assert says in err, err


def test_the_clean_zip_and_a_fixed_alpha_still_export(sb3_zip: Path, tmp_path: Path) -> None:
    """The bounds and checks above refuse nothing SB3 writes."""
    fixed = _fixed_ent_coef(0.2)(sb3_zip, tmp_path / "fixed.zip")
    for path in (sb3_zip, fixed):
        source = load_source(str(path))
        assert source.spec.hidden == (8,)
    log_alpha = load_source(str(fixed)).learner["log_alpha"]
    assert torch.allclose(log_alpha, torch.tensor([np.log(0.2)], dtype=torch.float32))
