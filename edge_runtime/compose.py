"""The builder of a run, shared by ``sac-edge run``, ``sac-edge bench`` and the runtime API (``runtime.py``).

In order, each step producing a typed value and nothing assigned after construction: the config
validated (``validate``: every flag, before anything is opened), the verified bundle (``verified_bundle``),
the last good weights under the fine-tuning lock (``last_good_weights``), the shield (``make_shield``),
then ``compose``: the backends (``--backend auto`` timed here), the memory probe, the learner process and
its sizing, the governor (sized from the learner's batch), the fine-tuner (the shield's ramp listening to
its swaps from the start), the power sensor and the budget monitor. ``Runtime.open`` runs these steps and
adds the per-call guards; ``sac-edge run`` makes its env between the bundle and the runtime and its loop
after it; ``sac-edge bench`` takes the bundle and the backends. All call the same functions, so none
can compose a run differently.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from sac_edge.common.atomic import check_output_path
from sac_edge.common.envelope import parse_envelope
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.lockfile import pid_lock
from sac_edge.edge_runtime.backends.autoselect import Measurement, autoselect
from sac_edge.edge_runtime.backends.base import PRECISION_ORDER, Backend, BackendOptions, Bundle, open_bundle
from sac_edge.edge_runtime.backends.registry import open_backend, refusal
from sac_edge.edge_runtime.budget.governor import Governor, GovernorConfig, build_ladder
from sac_edge.edge_runtime.budget.memory import MemoryProbe
from sac_edge.edge_runtime.budget.monitor import BudgetMonitor
from sac_edge.edge_runtime.budget.sensors import NoPowerSensor, PowerSensor, detect_power_sensor
from sac_edge.edge_runtime.control.realtime import check_idle_latency
from sac_edge.edge_runtime.control.shield import Shield, ShieldSettings
from sac_edge.edge_runtime.finetune.finetuner import FineTuner, build_finetuner, finetune_dir, install_last_good
from sac_edge.edge_runtime.finetune.promotion import LastGood, LastGoodStore, PromotionRules
from sac_edge.edge_runtime.finetune.settings import FinetuneSettings
from sac_edge.edge_runtime.finetune.weight_swap import WeightSwapper

from .config import BenchConfig, RunConfig

#: The fastest control rate accepted (a 10 us period; faster is not a control loop Python can keep).
MAX_RATE_HZ = 100_000.0
#: The slowest: one step every 1000 s (slower is not a control loop; the loop still sees a stop at once).
MIN_RATE_HZ = 1e-3
#: The longest ``--duration`` other than 0 (run until stopped): about 31 years.
MAX_DURATION_S = 1e9
#: The longest busy-wait before a slot and the longest inference watchdog limit.
MAX_SPIN_US, MAX_INFERENCE_TIMEOUT_S = 1e6, 3600.0
#: The fewest replay rows the learner takes (it also needs room for ``--learning-starts`` transitions).
MIN_FINETUNE_ROWS = 1000

Emit = typing.Callable[[typing.Dict[str, Any]], None]
Log = typing.Callable[[str], None]


def validate(cfg: RunConfig) -> None:
    """Every flag's value, before the bundle, an env or a backend is opened (one line, exit 2)."""
    if cfg.finetune:
        _validate_finetune(cfg)
    if cfg.resume and cfg.restart:
        raise SacEdgeError("--resume and --restart exclude each other: continue from the last good weights, or not")
    if cfg.restart and not cfg.finetune:
        raise SacEdgeError("--restart only applies with --finetune")
    if not MIN_RATE_HZ <= cfg.rate_hz <= MAX_RATE_HZ:
        raise SacEdgeError(
            f"--rate-hz must be from {MIN_RATE_HZ:g} to {MAX_RATE_HZ:g} steps per second, got {cfg.rate_hz}"
        )
    if not 0 <= cfg.duration <= MAX_DURATION_S:
        raise SacEdgeError(
            f"--duration must be from 0 (run until stopped) to {MAX_DURATION_S:g} seconds, got {cfg.duration}"
        )
    if not 0 <= cfg.spin_us <= MAX_SPIN_US:
        raise SacEdgeError(f"--spin-us must be from 0 to {MAX_SPIN_US:g} microseconds, got {cfg.spin_us}")
    if not 0 <= cfg.realtime_priority <= 99:
        raise SacEdgeError(f"--realtime-priority must be 1..99 (0: off), got {cfg.realtime_priority}")
    if not 0 <= cfg.seed < 2**64:
        raise SacEdgeError(f"--seed must be from 0 to 2**64 - 1 (numpy's seeds), got {cfg.seed}")
    if any(cpu < 0 for cpu in cfg.cpus):
        raise SacEdgeError(f"--cpus takes CPU numbers from 0, got {','.join(map(str, cfg.cpus))}")
    if cfg.max_backend_errors < 1:
        raise SacEdgeError(f"--max-backend-errors must be at least 1, got {cfg.max_backend_errors}")
    for flag, budget in (("--mem-budget-mb", cfg.mem_budget_mb), ("--power-budget-w", cfg.power_budget_w)):
        if budget is not None and not 0 < budget < math.inf:
            raise SacEdgeError(f"{flag} must be a positive number, got {budget}")
    if cfg.telemetry:
        check_output_path(cfg.telemetry, "--telemetry")
        if os.path.lexists(cfg.telemetry) and not cfg.overwrite_telemetry:
            raise SacEdgeError(
                f"--telemetry {cfg.telemetry} already exists; choose another path or pass --overwrite-telemetry"
            )
        if os.path.islink(cfg.telemetry) or (os.path.lexists(cfg.telemetry) and not os.path.isfile(cfg.telemetry)):
            raise SacEdgeError(f"--telemetry {cfg.telemetry} is a symlink or not a regular file; choose another path")
    if not 0 < cfg.inference_budget <= 1:
        raise SacEdgeError(f"--inference-budget is a fraction of the period in (0, 1], got {cfg.inference_budget}")
    if not 0 < cfg.inference_timeout <= MAX_INFERENCE_TIMEOUT_S:
        raise SacEdgeError(
            f"--inference-timeout must be more than 0 and at most {MAX_INFERENCE_TIMEOUT_S:g} seconds, "
            f"got {cfg.inference_timeout}"
        )
    if cfg.finetune:  # a read-only bundle would otherwise fail at the lock, after the bundle was verified
        check_output_path(finetune_dir(FinetuneSettings.of(cfg)), "--finetune-dir", directory=True)
    if cfg.threads < 1 or cfg.auto_calls < 1:
        raise SacEdgeError("--threads and --auto-calls must be at least 1")
    if cfg.idle_latency_us is not None:
        check_idle_latency(cfg.idle_latency_us)
    problem = shield_settings(cfg).problem()
    if problem is not None:
        raise SacEdgeError(problem)


def _validate_finetune(cfg: RunConfig) -> None:
    """The fine-tuning flags, including the ones the learner process and the promotion rules read."""
    for name in ("finetune_buffer", "finetune_batch", "swap_every", "learning_starts"):
        if getattr(cfg, name) < 1:
            raise SacEdgeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if cfg.finetune_buffer < max(cfg.learning_starts, MIN_FINETUNE_ROWS):
        raise SacEdgeError(
            f"--finetune-buffer {cfg.finetune_buffer} is below the {max(cfg.learning_starts, MIN_FINETUNE_ROWS)} "
            f"rows fine-tuning needs (at least {MIN_FINETUNE_ROWS} and --learning-starts)"
        )
    if not 0 < cfg.finetune_utd < math.inf:
        raise SacEdgeError(f"--finetune-utd must be a positive number, got {cfg.finetune_utd}")
    if not 0 < cfg.learner_cpu <= 1:
        raise SacEdgeError(f"--learner-cpu is a fraction of one core in (0, 1], got {cfg.learner_cpu}")
    if not 0 < cfg.finetune_lr < math.inf or not 0 <= cfg.explore_std < math.inf:
        raise SacEdgeError("--finetune-lr must be positive and --explore-std non-negative")
    promotion_rules(cfg)
    if importlib.util.find_spec("torch") is None:
        raise SacEdgeError(
            "--finetune needs the Python package 'torch' (pip install 'sac-edge[finetune]'; "
            "the inference-only path does not)"
        )


def promotion_rules(cfg: RunConfig) -> PromotionRules:
    """``--promotion-window``, ``--rollback-threshold``, ``--rollback-noise-z`` and ``--shadow-max-diff``,
    checked where the rules are made."""
    return PromotionRules(cfg.promotion_window, cfg.rollback_threshold, cfg.shadow_max_diff, cfg.rollback_noise_z)


def verified_bundle(cfg: RunConfig | BenchConfig) -> Bundle:
    """``cfg.bundle`` opened with its checksums verified (and its signature, with ``--trusted-keys``)."""
    return open_bundle(cfg.bundle, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade)


class LastGoodWeights(NamedTuple):
    """The fine-tuning directory's store (its lock held when fine-tuning) and the weights to start from."""

    store: LastGoodStore
    last: LastGood | None
    """With ``--resume``: the last good weights, checked; else None (the bundle's weights)."""


@contextlib.contextmanager
def last_good_weights(cfg: RunConfig) -> Iterator[LastGoodWeights]:
    """The store and the weights to start from (with ``--resume``), with the fine-tuning directory's lock
    held throughout when fine-tuning: one fine-tuner per weights directory, or each would overwrite the
    other's."""
    store = LastGoodStore(finetune_dir(FinetuneSettings.of(cfg)))
    with contextlib.ExitStack() as held:
        if cfg.finetune:
            held.enter_context(pid_lock(store.lock, f"fine-tuning directory {store.dir}"))
            if store.holds_weights() and not (cfg.resume or cfg.restart):
                held_path = store.path if store.exists() else store.previous
                raise SacEdgeError(
                    f"{held_path} holds fine-tuned weights; pass --resume to continue from them or "
                    "--restart to start again from the bundle weights (they are then kept as previous.safetensors "
                    "at the first promotion)"
                )
        yield LastGoodWeights(store, store.load() if cfg.resume else None)


def open_backends(cfg: RunConfig, bundle: Bundle, log: Log) -> tuple[dict[str, Backend], list[Measurement]]:
    """The serving backend, plus (with budgets) the same backend at each cheaper accepted precision."""
    options = BackendOptions(threads=cfg.threads, refit=cfg.finetune)
    figures: list[Measurement] = []
    if cfg.backend == "auto":
        precisions = [cfg.precision] if cfg.precision else None
        backend, figures = autoselect(bundle, options, precisions, calls=cfg.auto_calls, log=log)
    else:
        backend = open_backend(bundle, cfg.backend, cfg.precision or "fp32", options)
    backends = {backend.precision: backend}
    if has_budgets(cfg):
        cheaper = PRECISION_ORDER[PRECISION_ORDER.index(backend.precision) + 1 :]
        for precision in cheaper:
            if refusal(bundle, backend.name, precision) is None:
                backends[precision] = open_backend(bundle, backend.name, precision, options)
    return backends, figures


def has_budgets(cfg: RunConfig) -> bool:
    return cfg.mem_budget_mb is not None or cfg.power_budget_w is not None


def make_governor(cfg: RunConfig, precisions: Sequence[str], finetune_batch: int | None) -> Governor | None:
    """The governor for ``cfg``'s budgets over ``precisions`` (serving one first), or None without budgets."""
    if not has_budgets(cfg):
        return None
    ladder = build_ladder(
        cfg.rate_hz,
        precisions[0],
        list(precisions),
        finetune_batch=finetune_batch,
        min_finetune_batch=min(32, finetune_batch or 32),
    )
    return Governor(GovernorConfig(cfg.mem_budget_mb, cfg.power_budget_w), ladder)


def shield_settings(cfg: RunConfig) -> ShieldSettings:
    """The ``--shield*`` flags as the shield's settings."""
    return ShieldSettings(
        cfg.shield, cfg.shield_window, cfg.stuck_steps, cfg.ramp_steps, cfg.fallback, cfg.safe_action, cfg.slew
    )


def make_shield(cfg: RunConfig, bundle: Bundle, emit: Emit) -> Shield | None:
    """The shield for ``cfg`` on ``bundle`` (its envelope from the verified bytes), or None with
    ``--shield guards``. Before the backends open: a flag that does not fit the bundle's dims is one line. A
    bundle without ``envelope.json`` (exported before it, or ``--no-envelope``) gets the rest of the shield;
    the summary's ``shield.envelope`` says so."""
    settings = shield_settings(cfg)
    if settings.mode == "guards":
        return None
    spec = bundle.spec
    problem = settings.problem(spec.act_dim)
    if problem is not None:
        raise SacEdgeError(problem)
    names = bundle.files("envelope")
    envelope = None
    if names:
        path = bundle.path / names[0]
        envelope = parse_envelope(bundle.read(path), path, spec.obs_dim, spec.act_dim)
    return Shield(settings, spec.action_low, spec.action_high, envelope, emit)


def locked(write: Emit) -> Emit:
    """``write`` behind a lock: the loop and the fine-tuner's coordinator thread both emit records."""
    lock = threading.Lock()

    def emit(record: dict[str, Any]) -> None:
        with lock:
            write(record)

    return emit


@dataclass(frozen=True)
class Composition:
    """What a run is made of, once the bundle is verified (the caller stops ``tuner`` and closes ``monitor``)."""

    backends: dict[str, Backend]
    """By precision; the first one serves at the start."""
    figures: list[Measurement]
    """With ``--backend auto``: each candidate's start-up timing or refusal."""
    probe: MemoryProbe
    shield: Shield | None
    """With ``--shield on``; the fine-tuner's swaps restart its ramp."""
    tuner: FineTuner | None
    resumed: dict[str, Any] | None
    """With ``--resume``: the restored weights (sha256, step, swap outcome)."""
    governor: Governor | None
    sensor: PowerSensor | None
    monitor: BudgetMonitor

    @property
    def first(self) -> str:
        return next(iter(self.backends))

    def auto(self, unavailable: bool = True) -> list[dict[str, Any]]:
        """The ``auto`` figures as reported (without the kinds not installed here unless ``unavailable``)."""
        return [m._asdict() for m in self.figures if unavailable or m.refusal is None or "unavailable" not in m.refusal]


def compose(
    cfg: RunConfig, bundle: Bundle, weights: LastGoodWeights, shield: Shield | None, emit: Emit, log: Log
) -> Composition:
    """Backends, probe, fine-tuner (its learner process started), governor, sensor and monitor for ``cfg``.

    ``cfg`` must have passed :func:`validate`; ``weights`` come from :func:`last_good_weights`, ``shield``
    from :func:`make_shield`."""
    backends, figures = open_backends(cfg, bundle, log)
    probe = MemoryProbe(Path(cfg.sensor_root))
    last = weights.last
    precisions = list(backends)
    tuner, resumed = None, None
    if cfg.finetune:
        tuner, resumed = build_finetuner(
            FinetuneSettings.of(cfg), bundle, backends, probe, last, emit, log, promotion_rules(cfg),
            lambda batch: make_governor(cfg, precisions, batch),
            listeners=[shield.weights_swapped] if shield is not None else [], store=weights.store,
        )  # fmt: skip
        governor = tuner.governor
    else:
        governor = make_governor(cfg, precisions, None)
        if last is not None:
            resumed = install_last_good(WeightSwapper(backends, bundle), last)[1]
    try:
        root = Path(cfg.sensor_root)
        sensor = detect_power_sensor(root) if cfg.telemetry or cfg.power_budget_w is not None else None
        if isinstance(sensor, NoPowerSensor):
            if cfg.power_budget_w is not None:
                log(f"sac-edge run: --power-budget-w {cfg.power_budget_w:g} cannot be enforced: {sensor.reason}")
            sensor = None
        monitor = BudgetMonitor(probe, sensor, governor)
    except BaseException:
        if tuner is not None:
            tuner.stop()
        raise
    return Composition(backends, figures, probe, shield, tuner, resumed, governor, sensor, monitor)
