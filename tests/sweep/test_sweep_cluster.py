"""sac-sweep on a real multi-node Ray cluster built on this machine (tests/sweep/ray_cluster.py): a head with 0
CPUs and two 1-CPU workers, each with its own disk over the sweep folder, in a network namespace holding only
the loopback. Every result is compared, value for value, with the same sweep on a local Ray.

- no usable storage: one line before any trial starts; a token the cluster refuses: one line saying so;
- a shared path, the driver interrupted (SIGINT) mid-trial, then --resume: the reference's summary, and
  sac-export works on the head's copy;
- an S3-compatible store (moto's server on the loopback), a worker killed mid-trial and a fresh one added:
  every trial retried elsewhere from its checkpoint, the reference's returns.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray.tune")
from ray_cluster import Cluster, start_cluster, unshare_refusal

from sac_edge.export.cli import main as export_main
from sac_edge.sweep.cli import main as sweep_main

pytestmark = pytest.mark.slow
REFUSAL = unshare_refusal()
if REFUSAL is not None:
    pytest.skip(f"no cluster on one machine: {REFUSAL}", allow_module_level=True)

TINY = [
    "--total-steps", "1500", "--learning-starts", "400", "--eval-every", "500", "--eval-episodes", "1",
    "--hidden", "16,16", "--batch-size", "32", "--threads", "1", "--seeds", "2", "--json",
]  # fmt: skip
S3_PORT = 6399
BUCKET = "sweeps"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
S3_URI = f"s3://{BUCKET}/cluster?endpoint_override=127.0.0.1:{S3_PORT}&scheme=http"
TIMEOUT = 300


WALL_TIME_KEYS = ("wall_s", "cost_usd", "time_to_target_s")


def comparable(summary: dict[str, Any], out: Path) -> str:
    """A summary without what differs between two runs of the same sweep (its folder, its wall times and
    what follows from them: cost, time to a target)."""
    kept = _without_times({k: v for k, v in summary.items() if k != "summary"})
    return json.dumps(kept, sort_keys=True).replace(str(out.resolve()), "DIR")


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k not in WALL_TIME_KEYS}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


def curves(out: Path) -> dict[str, list[str]]:
    """Each trial's evaluations as metrics.csv holds them in DIR/trials (text: exact values)."""
    rows = {}
    for run in sorted((out / "trials").iterdir()):
        lines = (run / "metrics.csv").read_text().splitlines()
        head = lines[0].split(",")
        step, ret = head.index("step"), head.index("eval_return")
        rows[run.name] = [f"{r.split(',')[step]}:{r.split(',')[ret]}" for r in lines[1:] if r.split(",")[ret]]
    return rows


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, list[str]]]:
    """The same sweep on a local Ray: its comparable summary and its trials' evaluations."""
    out = tmp_path_factory.mktemp("reference") / "sweep"
    assert sweep_main(["--out", str(out), "--cpus", "2", *TINY]) == 0
    return comparable(json.loads((out / "summary.json").read_text()), out), curves(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    private = tmp_path_factory.mktemp("head-disk")  # the workers see an empty disk of their own here
    nodes = start_cluster(private, {"head": 0, "w1": 1, "w2": 1})
    try:
        yield nodes
    finally:
        nodes.close()


def test_the_clusters_loopback_is_up_every_time(tmp_path: Path) -> None:
    """The namespace's lo was sometimes left down (an ``ip link set lo up`` entered before unshare(2) had run
    lands in this machine's namespace): every connect in it then failed and the head never answered (CI)."""
    for _ in range(20):
        nodes = Cluster(tmp_path)
        try:
            link = subprocess.run(nodes.netns(["ip", "-o", "link", "show", "lo"]), capture_output=True, text=True)
            assert ",UP" in link.stdout, link
        finally:
            nodes.close()


def _start(cluster: Cluster, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return cluster.sweep(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or {})


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return proc.returncode, out, err


def _wait_for(check: Any, what: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert proc.poll() is None, f"the sweep ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {TIMEOUT} s"
        time.sleep(0.2)


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())


def test_without_shared_storage_one_line_before_any_trial(cluster: Cluster) -> None:
    out = cluster.private / "no-storage"
    rc, stdout, err = _finish(_start(cluster, ["--address", cluster.address, "--out", str(out), *TINY]))
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("sac-sweep: error: "), err
    assert "not usable from node 127.0.0.1" in lines[0] and "--storage" in lines[0], lines[0]
    assert not (out / "trials").exists() and not stdout


def test_a_refused_token_is_named(cluster: Cluster, tmp_path: Path) -> None:
    wrong = tmp_path / "token"
    wrong.write_text("0" * 64)
    argv = ["--address", cluster.address, "--out", str(cluster.private / "token"), *TINY]
    # Ray's driver retries a refused join once a second, 20 times by default: 3 tries give the same refusals
    retries = {"RAY_NUM_REDIS_GET_RETRIES": "3"}
    rc, stdout, err = _finish(_start(cluster, argv, {"RAY_AUTH_TOKEN_PATH": str(wrong), **retries}))
    assert rc == 2 and not stdout, err
    assert err.strip().splitlines() == [
        f"sac-sweep: error: the Ray cluster at {cluster.address} refused this machine's token; set RAY_AUTH_MODE=token "
        "and the cluster's token (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH; `ray get-auth-token` on the head prints it)"
    ]


def test_shared_path_driver_interrupted_then_resumed(
    cluster: Cluster, reference: tuple[str, dict[str, list[str]]], tmp_path: Path
) -> None:
    out, shared = cluster.private / "shared-run", tmp_path / "shared"
    shared.mkdir()
    argv = ["--address", cluster.address, "--storage", str(shared), "--out", str(out)]
    driver = _start(cluster, [*argv, *TINY])
    _wait_for(lambda: any((shared / out.name).glob("*/checkpoint_*/trainer_state.json")), "checkpoint", driver)
    listening = cluster.listeners()  # trials running: every node, agent and worker is up
    driver.send_signal(signal.SIGINT)
    rc, _, err = _finish(driver)
    assert rc == 130 and "--resume" in err, err
    assert all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")) for a in listening), listening
    assert len(listening) >= 6, listening

    rc, stdout, err = _finish(_start(cluster, [*argv, "--resume", "--json"]))
    assert rc == 0, err
    assert comparable(_summary(out), out) == reference[0]
    assert curves(out) == reference[1]
    assert json.loads(stdout.splitlines()[-1])["completed"] == 2
    best = _summary(out)["best"]["run"]
    assert export_main([best, "--out", str(tmp_path / "bundle")]) == 0  # on the head, unchanged
    assert len(list((shared / out.name).glob("*/checkpoint_*"))) == 2  # one checkpoint kept per trial


@pytest.fixture
def s3(cluster: Cluster) -> Iterator[str]:
    """moto's S3 server on the cluster's loopback, with an empty bucket."""
    if shutil.which("moto_server", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    server = subprocess.Popen(
        cluster.netns([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(S3_PORT)]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    make = (
        "import boto3,time\nfor _ in range(100):\n try:\n"
        f"  boto3.client('s3',endpoint_url='http://127.0.0.1:{S3_PORT}').create_bucket(Bucket='{BUCKET}');break\n"
        " except Exception: time.sleep(0.2)\nelse: raise SystemExit(1)"
    )
    try:
        subprocess.run(cluster.netns([sys.executable, "-c", make]), env={**cluster.env, **S3_ENV}, check=True)
        yield S3_URI
    finally:
        server.kill()
        server.wait()


def _s3_checkpoint_exists(cluster: Cluster) -> subprocess.Popen[bytes]:
    """A process in the namespace that ends once any trial has a checkpoint in the bucket."""
    code = (
        "import pyarrow.fs as f,time\n"
        f"fs,p=f.FileSystem.from_uri('{S3_URI}')\n"
        "while not any(i.base_name=='trainer_state.json' for i in fs.get_file_info(f.FileSelector(p+'/s3-run',"
        "allow_not_found=True,recursive=True))): time.sleep(0.2)"
    )
    return subprocess.Popen(cluster.netns([sys.executable, "-c", code]), env={**cluster.env, **S3_ENV})


def test_s3_store_worker_killed_and_replaced(
    cluster: Cluster, reference: tuple[str, dict[str, list[str]]], s3: str, tmp_path: Path
) -> None:
    out = cluster.private / "s3-run"
    driver = _start(cluster, ["--address", cluster.address, "--storage", s3, "--out", str(out), *TINY], S3_ENV)
    watcher = _s3_checkpoint_exists(cluster)
    try:
        _wait_for(lambda: watcher.poll() is not None, "checkpoint in the bucket", driver)
    finally:
        watcher.kill()
    cluster.kill("w1")  # mid-trial: both trials have 1000 steps left
    cluster.start("w3", 1)
    rc, _, err = _finish(driver)
    assert rc == 0, err
    assert "lost its worker" in err and "retrying from its newest checkpoint" in err, err
    assert "Traceback" not in err, err
    assert comparable(_summary(out), out) == reference[0]
    assert curves(out) == reference[1]
    assert export_main([_summary(out)["best"]["run"], "--out", str(tmp_path / "bundle")]) == 0
