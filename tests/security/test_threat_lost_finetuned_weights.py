"""The last good fine-tuned weights exist nowhere else, so nothing may lose them.

- ``sac-export --force`` never deletes ``BUNDLE/finetune/`` unless told ``--discard-finetuned``, and never
  replaces a directory sac-export did not write;
- ``--finetune`` on a bundle with last good weights continues (``--resume``) or starts again
  (``--restart``) only when told which, also when only the previous generation is left;
- ``--telemetry`` never truncates an existing file unless told ``--overwrite-telemetry``;
- one fine-tuner per weights directory (a lock naming its owner's pid; a dead owner's lock is recovered);
- ``--resume`` refuses a damaged set (checksum, non-finite, absurd or integer weights), naming the previous
  generation that is kept; the generation counter continues across resumes.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from sac_edge.common.errors import SacEdgeError
from sac_edge.common.lockfile import pid_lock
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore
from sac_edge.export import cli as export_cli

FAST = [
    "--backend", "onnxruntime", "--rate-hz", "1000", "--learning-starts", "200", "--swap-every", "20",
    "--finetune-buffer", "2000", "--finetune-batch", "32",
]  # fmt: skip


def _weights(scale: float = 0.1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"actor.mu.weight": (rng.standard_normal((1, 8)) * scale).astype(np.float32), "log_alpha": np.zeros(1)}


def _save(store: LastGoodStore, generation: int, weights: dict[str, np.ndarray] | None = None) -> None:
    store.save(weights or _weights(), np.zeros((2, 3), np.float32), {"generation": generation, "step": generation})


def _export_force(bundle: Path, *extra: str) -> list[str]:
    return [str(bundle.parent / "no-such-run"), "--out", str(bundle), "--force", *extra]


def test_force_reexport_refuses_to_delete_finetuned_weights(bundle: Path, refused: Callable[..., str]) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 19)
    before = store.path.read_bytes()
    err = refused(export_cli.main, _export_force(bundle), prog="sac-export")
    assert "holds fine-tuned weights" in err and "--discard-finetuned" in err
    assert store.path.read_bytes() == before


def test_force_reexport_with_discard_finetuned_goes_on(bundle: Path, refused: Callable[..., str]) -> None:
    _save(LastGoodStore(bundle / "finetune"), 19)
    err = refused(export_cli.main, _export_force(bundle, "--discard-finetuned"), prog="sac-export")
    assert "run dir not found" in err  # past the --out check, stopped by the missing run before any write
    assert (bundle / "finetune" / "last_good.safetensors").is_file()


def test_force_refuses_a_directory_sac_export_did_not_write(tmp_path: Path, refused: Callable[..., str]) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "manifest.json").write_text(json.dumps({"name": "my web app", "start_url": "/"}))
    (site / "index.html").write_text("<html></html>")
    err = refused(export_cli.main, _export_force(site), prog="sac-export")
    assert "was not written by sac-export" in err and (site / "index.html").is_file()


def test_force_refuses_a_symlinked_out(bundle: Path, tmp_path: Path, refused: Callable[..., str]) -> None:
    link = tmp_path / "link"
    os.symlink(bundle, link)
    assert "is not a bundle" in refused(export_cli.main, _export_force(link), prog="sac-export")


def test_finetune_over_last_good_needs_resume_or_restart(bundle: Path, refused: Callable[..., str]) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 19)
    before = store.path.read_bytes()
    err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])
    assert "--resume" in err and "--restart" in err and store.path.read_bytes() == before
    both = ["run", str(bundle), "--finetune", "--resume", "--restart"]
    assert "exclude each other" in refused(edge_cli.main, both)


def test_two_finetuners_on_one_bundle_are_kept_apart(bundle: Path, refused: Callable[..., str]) -> None:
    store = LastGoodStore(bundle / "finetune")
    with pid_lock(store.lock, "test"):
        err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])
    assert f"in use by process {os.getpid()}" in err


def test_stale_lock_of_a_dead_process_is_recovered(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("999999999\n")  # a killed owner: the file stays, the kernel lock does not
    with pid_lock(lock, "test"):
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(SacEdgeError, match=f"in use by process {os.getpid()}"), pid_lock(lock, "test"):
            pass


def _flip_last_byte_of_data(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40  # inside the tensor data: the file still parses
    path.write_bytes(bytes(data))


def test_resume_refuses_a_flipped_byte_and_names_the_previous_generation(
    bundle: Path, refused: Callable[..., str]
) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 18)
    _save(store, 19)
    _flip_last_byte_of_data(store.path)
    err = refused(edge_cli.main, ["run", str(bundle), "--resume", "--duration", "0.1"])
    assert "checksum mismatch" in err and "previous good generation (18)" in err


@pytest.mark.parametrize("value", [np.nan, np.inf, 1e30])
def test_resume_refuses_non_finite_or_absurd_weights(bundle: Path, refused: Callable[..., str], value: float) -> None:
    store = LastGoodStore(bundle / "finetune")
    bad = _weights()
    bad["actor.mu.weight"][0, 3] = value
    _save(store, 4, bad)
    err = refused(edge_cli.main, ["run", str(bundle), "--resume", "--duration", "0.1"])
    assert "damaged" in err and ("non-finite" in err or "magnitude" in err) and "--restart" in err


def test_generation_counter_continues_on_resume(
    clean_finetune_bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = Path(shutil.copytree(clean_finetune_bundle, tmp_path / "b"))
    from safetensors.numpy import load_file

    store = LastGoodStore(bundle / "finetune")
    learner = load_file(str(bundle / "learner.safetensors"))
    store.save(learner, np.zeros((0, 3), np.float32), {"generation": 19, "step": 100})
    argv = ["run", str(bundle), "--finetune", "--resume", "--duration", "3", *FAST, "--promotion-window", "1"]
    assert edge_cli.main([*argv, "--rollback-threshold", "1000", "--json"]) == 0
    ft = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["finetune"]
    assert ft["start_generation"] == 19 and ft["promotions"] > 0 and ft["generation"] > 19, ft
    assert json.loads(store.info_path.read_text())["generation"] == ft["generation"]


def test_finetune_over_a_lone_previous_generation_needs_resume_or_restart(
    bundle: Path, refused: Callable[..., str]
) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 18)
    _save(store, 19)
    store.path.unlink()  # a power cut between a save's two renames, or a damaged set moved away
    before = store.previous.read_bytes()
    err = refused(edge_cli.main, ["run", str(bundle), "--finetune", "--duration", "0.1"])
    assert "previous.safetensors holds fine-tuned weights" in err and "--resume" in err and "--restart" in err
    assert store.previous.read_bytes() == before


def test_telemetry_never_truncates_an_existing_file(bundle: Path, refused: Callable[..., str]) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 7)
    before = store.path.read_bytes()
    err = refused(edge_cli.main, ["run", str(bundle), "--duration", "0.1", "--telemetry", str(store.path)])
    assert "already exists" in err and "--overwrite-telemetry" in err
    assert store.path.read_bytes() == before


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_resume_refuses_integer_weights(bundle: Path, refused: Callable[..., str], dtype: type) -> None:
    store = LastGoodStore(bundle / "finetune")
    _save(store, 5, {"actor.mu.weight": np.ones((1, 8), dtype), "log_alpha": np.zeros(1)})
    err = refused(edge_cli.main, ["run", str(bundle), "--resume", "--duration", "0.1"])
    assert "damaged" in err and "not floating-point weights" in err
