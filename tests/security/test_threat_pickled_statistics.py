"""Threat: a VecNormalize ``.pkl`` from elsewhere (``sac-export ZIP --vecnormalize FILE``). The file is read
as data, never unpickled: even numpy's own reconstructors, called on the file's arguments, let a 700-byte
file rewrite a dtype an array already uses (``dtype.__setstate__``: reads past the array, or a pointer made
of the file's bytes). Real files give exactly SB3's statistics; every hostile form is one line, exit 2."""

from __future__ import annotations

import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sac_edge.export.cli import main as export_main
from sac_edge.export.vecnormalize import load_vecnormalize

sb3 = pytest.importorskip("stable_baselines3")
pytestmark = pytest.mark.torch

MULTIARRAY = "numpy._core.multiarray" if np.__version__ >= "2" else "numpy.core.multiarray"
PLAIN_STATE = (3, "<", None, None, None, -1, -1, 0)


# -- a small assembler of pickle opcodes, for the forms pickle.dumps cannot write -------------------------
def _plain(value: object) -> bytes:
    """``value``'s opcodes (protocol 3, no PROTO/STOP); its own memo entries stay below 1000."""
    return pickle.dumps(value, protocol=3)[2:-1]


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _put(key: int) -> bytes:
    return pickle.LONG_BINPUT + struct.pack("<I", key)


def _get(key: int) -> bytes:
    return pickle.LONG_BINGET + struct.pack("<I", key)


def _dtype(code: str, key: int, state: object = PLAIN_STATE) -> bytes:
    """``numpy.dtype(code)`` remembered as memo ``key``, then BUILD with ``state``."""
    made = _global("numpy", "dtype") + _plain((code, False, True)) + pickle.REDUCE + _put(key)
    return made + _plain(state) + pickle.BUILD


def _array(dtype: bytes, shape: tuple[int, ...], data: object) -> bytes:
    """An ndarray as numpy pickles it: ``_reconstruct(ndarray, (0,), b'b')`` then BUILD with its state."""
    head = _global(MULTIARRAY, "_reconstruct") + _global("numpy", "ndarray") + _plain((0,)) + _plain(b"b")
    state = pickle.MARK + _plain(1) + _plain(shape) + dtype + _plain(False) + _plain(data) + pickle.TUPLE
    return head + pickle.TUPLE3 + pickle.REDUCE + state + pickle.BUILD


def _record(module: str, name: str, fields: bytes) -> bytes:
    """An object pickled by NEWOBJ with a dict of ``fields`` (key/value opcodes) as its BUILD state."""
    return (
        _global(module, name) + pickle.EMPTY_TUPLE + pickle.NEWOBJ
        + pickle.EMPTY_DICT + pickle.MARK + fields + pickle.SETITEMS + pickle.BUILD
    )  # fmt: skip


def _vecnormalize(mean: bytes, var: bytes, after: bytes = b"") -> bytes:
    """A VecNormalize file with these arrays as ``obs_rms.mean/var``; ``after`` runs before STOP."""
    rms = _record("stable_baselines3.common.running_mean_std", "RunningMeanStd",
                  _plain("mean") + mean + _plain("var") + var)  # fmt: skip
    fields = _plain("obs_rms") + rms + _plain("epsilon") + _plain(1e-8) + _plain("clip_obs") + _plain(5.0)
    top = _record("stable_baselines3.common.vec_env.vec_normalize", "VecNormalize", fields)
    return pickle.PROTO + b"\x03" + top + after + pickle.STOP


F8 = np.arange(3, dtype="<f8")
CLEAN = _vecnormalize(_array(_dtype("f8", 1000), (3,), F8.tobytes()), _array(_get(1000), (3,), (F8 + 1).tobytes()))


# -- real files ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """VecNormalize files SB3 wrote (``save`` and every protocol it may use), with and without seeded spaces."""
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    root, files = tmp_path_factory.mktemp("vecnormalize"), []
    for env_id in ("Pendulum-v1", "MountainCarContinuous-v0"):
        venv = VecNormalize(DummyVecEnv([lambda env_id=env_id: gym.make(env_id)]), clip_obs=3.0)
        venv.seed(3)
        venv.observation_space.seed(4)  # a generator's state in the pickled space
        venv.reset()
        for _ in range(40):
            venv.step(np.array([venv.action_space.sample()]))
        venv.save(root / f"{env_id}.pkl")
        files.append(root / f"{env_id}.pkl")
        for protocol in (3, 4, 5):
            files.append(root / f"{env_id}-p{protocol}.pkl")
            files[-1].write_bytes(pickle.dumps(venv, protocol=protocol))
    return files


def test_real_files_give_sb3s_own_statistics(real_files: list[Path]) -> None:
    import gymnasium as gym
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    for path in real_files:
        env_id = path.stem.split("-p")[0]
        # SB3's own loader unpickles: fine for a file this test has just written.
        want = VecNormalize.load(str(path), DummyVecEnv([lambda env_id=env_id: gym.make(env_id)]))
        got = load_vecnormalize(path)
        assert got.mean.tobytes() == want.obs_rms.mean.astype(np.float64).tobytes(), path.name
        assert got.var.tobytes() == want.obs_rms.var.astype(np.float64).tobytes(), path.name
        assert (got.epsilon, got.clip_obs) == (want.epsilon, want.clip_obs) == (1e-8, 3.0)


def test_the_assembled_file_is_read(tmp_path: Path) -> None:
    """The hostile forms below differ from this one in one place only."""
    (tmp_path / "clean.pkl").write_bytes(CLEAN)
    stats = load_vecnormalize(tmp_path / "clean.pkl")
    assert stats.mean.tolist() == [0.0, 1.0, 2.0] and stats.var.tolist() == [1.0, 2.0, 3.0]
    assert (stats.epsilon, stats.clip_obs) == (1e-8, 5.0)


def test_a_dtype_rebuilt_under_its_array_never_reaches_numpy(tmp_path: Path) -> None:
    """The memory corruption: BUILD again on the dtype the arrays use, with a 72-byte item size. In a child
    process, since before the fix this reads past the arrays (junk statistics, or SIGSEGV)."""
    hostile = tmp_path / "grown-dtype.pkl"
    hostile.write_bytes(CLEAN[:-1] + _get(1000) + _plain((3, "<", None, None, None, 72, 8, 0)) + pickle.BUILD
                        + pickle.POP + pickle.STOP)  # fmt: skip
    code = "import sys; from pathlib import Path; from sac_edge.export.vecnormalize import load_vecnormalize as f\n"
    code += "try:\n    print(f(Path(sys.argv[1])).mean)\nexcept Exception as e:\n    print(e); sys.exit(2)"
    child = subprocess.run([sys.executable, "-c", code, str(hostile)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 2, (child.returncode, child.stdout, child.stderr[-300:])
    assert "BUILD" in child.stdout


HOSTILE: dict[str, tuple[bytes, str]] = {
    "object dtype": (
        _vecnormalize(
            _array(_dtype("O", 1000, (3, "|", None, None, None, -1, -1, 63)), (3,), [0.0, 1.0, 2.0]),
            _array(_get(1000), (3,), [1.0, 1.0, 1.0]),
        ),
        "dtype",
    ),
    "structured dtype": (
        _vecnormalize(
            _array(
                _dtype("V8", 1000, (3, "|", None, ("a",), {"a": (np.dtype("f8"), 0)}, 8, 1, 16)), (3,), F8.tobytes()
            ),
            _array(_get(1000), (3,), F8.tobytes()),
        ),
        "plain dtypes",
    ),
    "dtype built twice": (
        _vecnormalize(
            _array(_dtype("f8", 1000) + _plain(PLAIN_STATE) + pickle.BUILD, (3,), F8.tobytes()),
            _array(_get(1000), (3,), F8.tobytes()),
        ),
        "built once",
    ),
    "huge shape": (
        _vecnormalize(_array(_dtype("f8", 1000), (10**12,), b""), _array(_get(1000), (3,), F8.tobytes())),
        "larger than 64 MiB",
    ),
    "data shorter than the shape": (
        _vecnormalize(_array(_dtype("f8", 1000), (4,), F8.tobytes()), _array(_get(1000), (3,), F8.tobytes())),
        "array data of 24 bytes for 32",
    ),
    "truncated stream": (CLEAN[: len(CLEAN) // 2], "truncated"),
    "unknown opcode": (CLEAN[:-1] + b"\xff" + pickle.STOP, "opcode 0xff"),
    "an opcode that imports by name (INST)": (CLEAN[:-1] + pickle.MARK + b"ios\nsystem\n" + pickle.STOP, "opcode"),
    "foreign global": (
        _vecnormalize(_global("os", "system") + _plain(("true",)) + pickle.REDUCE, _get(0)),
        "refused global os.system",
    ),
    "numpy global outside the list": (
        _vecnormalize(_global("numpy", "frombuffer") + _plain((F8.tobytes(),)) + pickle.REDUCE, _get(0)),
        "refused global numpy.frombuffer",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_statistics_are_refused_in_one_line(
    case: str, sb3_zip: Path, tmp_path: Path, refused: Callable[..., str]
) -> None:
    data, says = HOSTILE[case]
    hostile = tmp_path / "vecnormalize.pkl"
    hostile.write_bytes(data)
    out = tmp_path / "bundle"
    err = refused(export_main, [str(sb3_zip), "--vecnormalize", str(hostile), "--out", str(out)], prog="sac-export")
    assert "not a VecNormalize file this reader accepts" in err and says in err, err
    assert "pass the .pkl that VecNormalize.save wrote" in err
    assert not out.exists()


def test_an_sb3_zip_is_exported_without_any_unpickler(
    sb3_zip: Path, real_files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zip's tensor files too: ``torch.load``, even with ``weights_only=True``, is a (restricted)
    unpickler; the export must not need it, nor ``pickle`` at all."""
    import torch

    from sac_edge.export.sb3 import load_sb3_zip

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("an unpickler was called")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    stats = load_vecnormalize(real_files[0])
    model = load_sb3_zip(sb3_zip, "", None, stats)
    assert model.spec.obs_dim == 3 and model.obs_norm is stats
    assert model.sb3_state["actor.mu.weight"].shape == (1, 8)
