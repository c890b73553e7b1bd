"""Threat: a ``--storage`` no trial can use. ``mock://`` (pyarrow's in-memory filesystem) and an S3 endpoint
that is down were exit 1 "internal error"; an endpoint that accepts connections and never answers held the
sweep 100 s (GCS without credentials: 15 minutes and more). Each is one line naming what to check, exit 2,
within ``remote.REACH_TIMEOUT_S``, before Ray starts. Every endpoint here is on the loopback (the GCS
metadata server too), and the S3 client is kept from looking for credentials anywhere else."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray.tune")

from sac_edge.sweep import remote
from sac_edge.sweep.cli import main as sweep_main

TINY = ["--total-steps", "300", "--eval-every", "300", "--seeds", "1", "--cpus", "1"]
PATIENCE_S = 60.0  # far longer than the shortened bound below, even on a busy machine


@pytest.fixture(autouse=True)
def _local_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from the environment, so the S3 client asks no metadata server off the loopback."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _s3(port: int) -> str:
    return f"s3://sweeps/lr?endpoint_override=127.0.0.1:{port}&scheme=http"


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers, open until the module ends: a client still
    waiting on it after its test (GCS keeps waiting for a metadata server) never reaches a port reused since."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in [*held, server]:
        conn.close()


def _refused_within(argv: list[str], refused: Callable[..., str]) -> str:
    """``refused`` for sac-sweep in a thread; still running after PATIENCE_S fails the test (the thread is
    left waiting on the silent port)."""
    result: dict[str, str] = {}
    worker = threading.Thread(
        target=lambda: result.update(line=refused(sweep_main, argv, prog="sac-sweep")), daemon=True
    )
    worker.start()
    worker.join(PATIENCE_S)
    if worker.is_alive():
        pytest.fail(f"sac-sweep {' '.join(argv)} still waiting after {PATIENCE_S:.0f} s")
    return result["line"]


def _closed_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_an_in_memory_filesystem_is_refused(tmp_path: Path, refused: Callable[..., str]) -> None:
    line = refused(sweep_main, ["--out", str(tmp_path / "s"), "--storage", "mock://sweeps/lr", *TINY], prog="sac-sweep")
    assert "mock:// is a filesystem in one process's memory" in line and "s3://" in line, line
    assert not (tmp_path / "s").exists()


def test_an_endpoint_that_is_down_is_one_line(tmp_path: Path, refused: Callable[..., str]) -> None:
    argv = ["--out", str(tmp_path / "s"), "--storage", _s3(_closed_port()), *TINY]
    line = refused(sweep_main, argv, prog="sac-sweep")
    assert "cannot reach it" in line and "endpoint_override" in line and "AWS_ACCESS_KEY_ID" in line, line


def test_an_endpoint_that_never_answers_is_named_within_the_bound(
    tmp_path: Path, refused: Callable[..., str], silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(remote, "REACH_TIMEOUT_S", 0.5)  # the bound, shortened; the client's own waits too,
    monkeypatch.setattr(remote, "STALL_TIMEOUT_S", 2.0)  # so the thread left waiting ends soon after the test
    line = _refused_within(["--out", str(tmp_path / "s"), "--storage", _s3(silent_port), *TINY], refused)
    assert "no answer within 0.5 s" in line and "reachable from here" in line, line


def test_gcs_without_credentials_is_named_within_the_bound(
    tmp_path: Path, refused: Callable[..., str], silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without credentials the GCS client waits for a cloud metadata server: here the silent loopback port
    (GCE_METADATA_ROOT names it), as a machine off the cloud never gets an answer."""
    monkeypatch.setenv("GCE_METADATA_ROOT", f"127.0.0.1:{silent_port}")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud credentials of this machine's user
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setattr(remote, "REACH_TIMEOUT_S", 1.0)
    uri = f"gs://sweeps/lr?endpoint_override=127.0.0.1:{silent_port}&scheme=http"
    line = _refused_within(["--out", str(tmp_path / "s"), "--storage", uri, *TINY], refused)
    assert "no answer within 1 s" in line and "GOOGLE_APPLICATION_CREDENTIALS" in line, line


def test_a_reachable_storage_is_rebuilt_with_its_settings_and_bounded_waits() -> None:
    from sac_edge.sweep.storage import open_storage

    storage = open_storage(_s3(9000))
    settings = storage.fs.__reduce__()[1][0]
    assert settings["endpoint_override"] == "127.0.0.1:9000" and settings["scheme"] == "http"
    assert (settings["connect_timeout"], settings["request_timeout"]) == (
        remote.CONNECT_TIMEOUT_S,
        remote.STALL_TIMEOUT_S,
    )
    assert storage.root == "sweeps/lr"
