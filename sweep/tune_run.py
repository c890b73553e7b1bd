"""The Ray Tune side of ``sac-sweep``: a local or joined Ray, the storage probe, the trial function and the Tuner.

A trial is ``sac-train``'s own ``Trainer`` in a Ray worker, writing an ordinary run dir on the node that runs
it; at each evaluation, once the checkpoint holding the evaluated weights is written, the whole run dir goes
to Tune as a checkpoint (persisted to the storage before the return is reported), so a trial that ASHA
stops, Ctrl-C interrupts or a dead node loses continues from weights its reported return was measured on.
A lost worker is retried by Tune from that checkpoint; the trainer's own errors end the trial. On
``--resume`` a fresh Tuner runs the trials that had not ended (``state``), each from its newest checkpoint
in the storage (``storage``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import os
import shutil
import socket
import sys
import tempfile
import traceback
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from sac_edge.common.bounded import open_regular
from sac_edge.common.errors import SacEdgeError
from sac_edge.train.config import TrainConfig
from sac_edge.train.threads import usable_cpus
from sac_edge.train.trainer import Trainer

from . import state
from .grid import Trial
from .state import LOGS
from .storage import Storage, checked_trials_dir, download, trial_dirname, write_manifest

EVAL = "eval_return"
STEP = "step"
ERROR = "error"
TRACEBACK = "traceback"
NAME = "trial"
ASHA_REDUCTION = 2
#: Retries of a trial whose actor or node died (each from its newest checkpoint, wherever Ray places it).
MAX_RETRIES = 3
MAX_TRACEBACK = 64 * 1024
PROBE_TIMEOUT_S = 120.0
#: How long a cluster's head may take to accept a TCP connection before ``--address`` is said to be wrong.
CONNECT_TIMEOUT_S = 5.0
ADDRESS_FIX = "start the cluster's head there (ray start --head) or check --address ('auto' on a node of the cluster)"


class _ReportingTrainer(Trainer):
    """``sac-train``'s trainer, handing its run dir to Tune as a checkpoint with each new evaluation, once the
    checkpoint holding the evaluated weights is written: every reported return was measured on persisted
    weights, and a trial retried elsewhere continues from them."""

    reported_step = -1

    def save(self) -> None:
        super().save()
        if self.last_eval is not None and self.step != self.reported_step:
            self.reported_step = self.step
            write_manifest(self.run)
            checkpoint = tune.Checkpoint.from_directory(str(self.run))
            tune.report({EVAL: self.last_eval, STEP: self.step}, checkpoint=checkpoint)


def _name(trial: Any) -> str:
    """The run name of a Tune trial (its run dir under ``DIR/trials/``), from its config."""
    return str(trial.config[NAME])


@contextmanager
def private_run_dir(session: str, name: str) -> Iterator[Path]:
    """A trial's working run dir on the node that runs it (fresh for each attempt), not yet created, inside a
    folder made for this attempt alone: ``mkdtemp`` creates it (never finds it) under an unpredictable name
    with mode 0700, so nothing another local user plants in the shared temp dir is followed, written or
    deleted. The folder goes, with everything in it, when the attempt ends."""
    private = Path(tempfile.mkdtemp(prefix=f"sac-sweep-{session}-"))
    try:
        yield private / name
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _start(run: Path, name: str, storage: Storage, resume_from: dict[str, str]) -> bool:
    """Fill the fresh ``run`` (not yet created) with the trial's newest checkpoint: this session's (a retry
    after a lost node) or an earlier session's; False when the trial starts from step 0."""
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        checkpoint.to_directory(str(run))
    elif name in resume_from:
        download(storage, resume_from[name], run)
    else:
        return False
    where = ray.util.get_node_ip_address()
    print(f"sac-sweep: {name}: resuming at step {state.saved_step(run)} on {where}", file=sys.stderr, flush=True)
    return True


def _run_trial(
    config: dict[str, Any],
    base: TrainConfig,
    trials: dict[str, Trial],
    session: str,
    storage: Storage,
    resume_from: dict[str, str],
) -> None:
    """One Tune trial: ``config`` names the trial (grid point and seed); ``base`` holds every other option."""
    name = config[NAME]
    with private_run_dir(session, name) as run:
        _train_trial(run, name, base, trials[name], storage, resume_from)


def _train_trial(
    run: Path, name: str, base: TrainConfig, trial: Trial, storage: Storage, resume_from: dict[str, str]
) -> None:
    """Train ``trial`` in ``run``. The trainer's own errors end the trial with a final result naming the error
    (and its traceback, which the head writes to the trial's log): only a lost actor or node is an error to
    Tune, and so retried."""
    trainer: _ReportingTrainer | None = None
    try:
        resume = _start(run, name, storage, resume_from)
        cfg = dataclasses.replace(
            base,
            **trial.point.values,
            seed=trial.seed,
            threads=int(trial_resources(base)["cpu"]),  # its share of the node: no probe, no oversubscription
            out=str(run),
            resume=resume,
            force=not resume,
            progress=False,
            json=False,
            checkpoint_every=base.eval_every,
        )
        trainer = _ReportingTrainer(cfg)
        trainer.train()
    except Exception as err:  # the trainer's (or its env's) own error: final, never retried
        step = trainer.reported_step if trainer is not None else -1
        last = trainer.last_eval if trainer is not None else None
        tune.report(
            {
                EVAL: float("nan") if last is None else last,
                STEP: max(step, 0),
                ERROR: f"{type(err).__name__}: {_error_line(err)}",
                TRACEBACK: traceback.format_exc()[-MAX_TRACEBACK:],
            }
        )


def trial_resources(base: TrainConfig) -> dict[str, float]:
    """CPUs per trial = ``--threads`` (0 means 1, so trials do not oversubscribe: the trial runs with that many
    threads, ``--threads 0``'s probe off); one GPU with ``--device cuda``."""
    return {"cpu": max(base.threads, 1), "gpu": 1 if base.device == "cuda" else 0}


LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's single-machine mode, node IP 127.0.0.1


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Ray's single-machine mode for the ``with`` block, whenever ray was imported.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, at import, into ``ray_constants.ENABLE_RAY_CLUSTER``;
    while it is true ``ray.init`` replaces a loopback ``_node_ip_address`` by the machine's routable address
    and GCS, raylet, agents and workers listen on every interface. Setting both (the constant for this
    process, the variable for the processes it starts) makes the node address, and so every listener, the
    loopback; both are restored afterwards.
    """
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(LOOPBACK_ONLY), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOOPBACK_ONLY], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(LOOPBACK_ONLY, None)
        else:
            os.environ[LOOPBACK_ONLY] = saved_env


#: Environment variables a trial's storage client reads (S3, GCS, Azure), passed to every Ray worker.
CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
)
#: Ray's loggers whose records sac-sweep replaces with its own lines: the token-auth notice of every
#: ``ray.init`` and Tune's trial tracebacks (kept in ``DIR/logs/<trial>.log`` instead).
QUIET_LOGGERS = ("ray._private.authentication.authentication_token_setup", "ray.tune", "ray.train", "ray.air")
AUTH_REFUSED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")
TOKEN_FIX = (
    "set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH; `ray get-auth-token` "
    "on the head prints it)"
)


def runtime_env() -> dict[str, Any]:
    """The job's runtime environment: the storage credentials set here, for the trials on every node."""
    env = {k: os.environ[k] for k in CREDENTIALS if os.environ.get(k)}
    return {"env_vars": env} if env else {}


@contextmanager
def _quiet_ray() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")  # errors a lost node leaves: ours say it
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def _fd2_to(sink: IO[bytes]) -> Iterator[None]:
    """The process's stderr (fd 2, where Ray's C++ core logs) into ``sink`` for the ``with`` block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _answers(address: str, said: IO[bytes]) -> None:
    """One line at once where nothing listens at the cluster's address (``auto`` as Ray resolves it: RAY_ADDRESS,
    then the newest ``ray start`` on this node); ``ray.init`` would retry it in silence for minutes (Ray 2.60:
    20 tries, each a GcsClient that waits up to ~35 s). What Ray's core logs meanwhile goes to ``said``."""
    try:  # Ray's own resolution (private, in every Ray sac-sweep supports); without it Ray is left to say
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return
    try:
        with _fd2_to(said):
            bootstrap = canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError) as err:
        raise SacEdgeError(f"--address {address}: {_error_line(err).rstrip('.')}; {ADDRESS_FIX}") from None
    if bootstrap is None:
        return
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or _error_line(err)
        raise SacEdgeError(f"nothing answers at {address} ({bootstrap}: {why}); {ADDRESS_FIX}") from None


def _join(address: str) -> None:
    """Join the cluster at ``address``; Ray's C++ core logs each refused attempt (tens of lines) on stderr,
    so they are kept aside and read to say why a join failed (a token the cluster refused)."""
    with tempfile.TemporaryFile() as said:
        _answers(address, said)
        try:
            with _fd2_to(said):
                ray.init(address=address, log_to_driver=False, configure_logging=False, runtime_env=runtime_env())
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
            said.seek(0)
            text = f"{err} {said.read()[-MAX_TRACEBACK:].decode(errors='replace')}"
            if isinstance(err, ray.exceptions.AuthenticationError) or any(w in text for w in AUTH_REFUSED):
                raise SacEdgeError(f"the Ray cluster at {address} refused this machine's token; {TOKEN_FIX}") from None
            first = _error_line(err)
            raise SacEdgeError(f"cannot join the Ray cluster at {address} ({first}); check --address") from None


@contextmanager
def ray_session(address: str | None, cpus: int, resources: dict[str, float]) -> Iterator[None]:
    """A local Ray on this machine's cores (every listener on the loopback, no dashboard), shut down at the
    end, or the cluster at ``address``, left running. Refuses, before any trial starts, a trial bigger than
    the whole cluster, and a local Ray whose node address is not the loopback."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_ray())
        if address is None:
            stack.enter_context(_loopback_only())
            ray.init(
                address="local",
                num_cpus=cpus or usable_cpus().n,  # the CPUs this process may use, not the host's
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _node_ip_address="127.0.0.1",
                runtime_env=runtime_env(),
            )
        else:
            _join(address)
        try:
            node_ip = ray.util.get_node_ip_address()
            if address is None and not ipaddress.ip_address(node_ip).is_loopback:
                raise SacEdgeError(
                    f"the local Ray came up on {node_ip}, not the loopback (this Ray release ignores its "
                    "single-machine mode); install ray[tune] 2.50 to 2.60, or start a Ray yourself and pass --address"
                )
            total = ray.cluster_resources()
            for name, need in resources.items():
                have = total.get(name.upper(), 0.0)
                if need > have:
                    where = "this machine's Ray" if address is None else f"the cluster at {address}"
                    raise SacEdgeError(
                        f"a trial needs {need:g} {name.upper()} but {where} has {have:g}; lower --threads or "
                        "use --device cpu" + (" or --cpus" if address is None else "")
                    )
            yield
        finally:
            ray.shutdown()


PROBE = ".probe"


def _probe_node(storage: Storage, token_path: str, token: str) -> str | None:
    """On one node: None when it reads the driver's token from storage and writes beside it, else why not."""
    try:
        with storage.fs.open_input_stream(token_path) as fh:
            seen = fh.read(len(token) + 1).decode(errors="replace")
        if seen != token:
            return "it sees another file there: a disk of its own, not the shared one"
        with storage.fs.open_output_stream(f"{token_path}.{ray.get_runtime_context().get_node_id()}") as fh:
            fh.write(token.encode())
    except FileNotFoundError:
        return "the path does not exist there: a disk of its own, not the shared one"
    except Exception as err:  # any failure of the storage client is the answer
        return _error_line(err)
    return None


def probe_storage(storage: Storage, given: bool) -> None:
    """Refuse, before any trial starts, a storage that an alive node of the cluster cannot read and write."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    token = uuid.uuid4().hex
    probe_dir = f"{storage.experiment_dir}/{PROBE}"
    token_path = f"{probe_dir}/{token}"
    try:
        storage.fs.create_dir(probe_dir, recursive=True)
        with storage.fs.open_output_stream(token_path) as fh:
            fh.write(token.encode())
    except Exception as err:
        raise SacEdgeError(f"--storage {storage.uri}: cannot write there from here ({_error_line(err)})") from None
    task = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    try:
        refs = [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
                storage, token_path, token
            )
            for n in nodes
        ]
        answers = ray.get(refs, timeout=PROBE_TIMEOUT_S)
    except (ray.exceptions.RayError, TimeoutError) as err:
        answers = [f"no answer ({_error_line(err)})"] * len(nodes)
    finally:
        with contextlib.suppress(Exception):
            storage.fs.delete_dir(probe_dir)
    for node, answer in zip(nodes, answers):
        if answer is not None:
            what = f"--storage {storage.uri}" if given else f"the sweep dir {storage.uri} (the default storage)"
            raise SacEdgeError(
                f"{what} is not usable from node {node.get('NodeManagerAddress')} ({answer}); give --storage a path "
                "every node mounts or a filesystem URI such as s3://bucket/prefix (docs/CLUSTER.md)"
            )


class _Progress(tune.Callback):
    """One stderr line as each trial ends, and the ended trials saved in ``DIR/trial_state.json`` (what
    ``--resume`` does not run again: Tune calls neither hook for a trial that Ctrl-C interrupts).

    A trial whose actor or node was lost and could not be retried is ``lost``, not ended: ``--resume``
    reruns it from its newest checkpoint. Tracebacks go to ``DIR/logs/<trial>.log``, named in the line.
    """

    def __init__(self, total: int, total_steps: int, sweep_dir: Path, ended: dict[str, str | None]) -> None:
        self.total, self.total_steps, self.done = total, total_steps, len(ended)
        self.sweep_dir, self.ended = sweep_dir, ended
        self.lost: dict[str, str] = {}

    def _log(self, name: str, text: str) -> str:
        """Append ``text`` to the trial's log (never through a link, never to a FIFO); its path, or why not."""
        path = self.sweep_dir / LOGS / f"{name}.log"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        try:
            with os.fdopen(open_regular(path, "a trial's log", "delete it", follow=False, flags=flags), "a") as fh:
                fh.write(text.rstrip() + "\n")
        except (SacEdgeError, OSError) as err:
            return f"not kept: {err}"
        return str(path)

    def _line(self, trial: Any, what: str, error: str | None = None) -> None:
        self.done += 1
        self.ended[_name(trial)] = error
        state.record_ended(self.sweep_dir, self.ended)
        print(f"sac-sweep: [{self.done}/{self.total}] {_name(trial)}: {what}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        last = trial.last_result or {}
        if last.get(ERROR):
            log = self._log(_name(trial), str(last.get(TRACEBACK) or last[ERROR]))
            self._line(trial, f"failed: {last[ERROR]} (traceback: {log})", str(last[ERROR]))
        elif last.get(EVAL) is None:
            self._line(trial, "no evaluation")
        else:
            stopped = f" (stopped at step {last[STEP]})" if last[STEP] < self.total_steps else ""
            self._line(trial, f"return {last[EVAL]:.1f}{stopped}")

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        line = _error_line(RuntimeError(_error_text(trial)))
        log = self._log(_name(trial), _error_text(trial))
        print(
            f"sac-sweep: {_name(trial)}: lost its worker ({line}); retrying from its newest checkpoint (log: {log})",
            file=sys.stderr,
            flush=True,
        )

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        line = _error_line(RuntimeError(_error_text(trial)))
        log = self._log(_name(trial), _error_text(trial))
        self.lost[_name(trial)] = line
        print(
            f"sac-sweep: {_name(trial)}: lost to the cluster after {MAX_RETRIES} retries ({line}; log: {log}); "
            "--resume reruns it from its newest checkpoint",
            file=sys.stderr,
            flush=True,
        )


def _error_text(trial: Any) -> str:
    """The text of a trial's latest error as Tune recorded it (a text file, never its pickle)."""
    path = trial.error_file
    if path and Path(path).is_file():
        return Path(path).read_text(errors="replace")[-MAX_TRACEBACK:]
    return str(trial.get_error() or "the trial's actor died")


def _scheduler(name: str, base: TrainConfig) -> TrialScheduler:
    if name == "asha":
        return ASHAScheduler(
            time_attr=STEP,
            max_t=base.total_steps,
            grace_period=base.eval_every,
            reduction_factor=ASHA_REDUCTION,
        )
    return FIFOScheduler()


def _error_line(err: BaseException) -> str:
    """The last line of a trial's error (Ray wraps the worker's traceback around it)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def run_trials(
    trials: Sequence[Trial],
    base: TrainConfig,
    sweep_dir: Path,
    storage: Storage,
    *,
    scheduler: str,
    max_concurrent: int,
    ended: dict[str, str | None],
    resume_from: dict[str, str],
) -> dict[str, str]:
    """Run ``trials`` (those not yet ended; each continues from ``resume_from`` where it has a checkpoint)
    on the current Ray, adding each trial that ends to ``ended`` (with its error line if it failed).
    Returns the trials lost to the cluster (retries exhausted), which ``--resume`` reruns.

    A trial that raises is recorded with its error; the others go on. Ctrl-C stops Tune cleanly and returns.
    Tune's experiment state (``<storage>/<sweep>``) is written for Tune's own use only: nothing of it but the
    trials' checkpoints (safetensors and JSON) is ever read back.
    """
    by_name = {t.run.name: t for t in trials}
    session = uuid.uuid4().hex[:12]
    trainable = tune.with_resources(
        tune.with_parameters(
            _run_trial, base=base, trials=by_name, session=session, storage=storage, resume_from=resume_from
        ),
        trial_resources(base),
    )
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0: no Tune tables on stdout
    checked_trials_dir(sweep_dir)  # and DIR/logs: no link to follow
    (sweep_dir / LOGS).mkdir(exist_ok=True)
    progress = _Progress(len(ended) + len(trials), base.total_steps, sweep_dir, ended)
    tuner = tune.Tuner(
        trainable,
        param_space={NAME: tune.grid_search(list(by_name))},
        tune_config=tune.TuneConfig(
            metric=EVAL,
            mode="max",
            scheduler=_scheduler(scheduler, base),
            max_concurrent_trials=max_concurrent or None,
            reuse_actors=True,  # a worker keeps torch imported for its next trial
            trial_name_creator=_name,
            trial_dirname_creator=lambda trial: trial_dirname(_name(trial), session),
        ),
        run_config=tune.RunConfig(
            name=storage.experiment,
            storage_path=storage.root,
            storage_filesystem=storage.fs,
            verbose=0,
            callbacks=[progress],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=MAX_RETRIES),
        ),
    )
    with _quiet_ray():
        tuner.fit()
    state.record_ended(sweep_dir, ended)
    return progress.lost
