"""The builder of a run, shared by ``sac-edge run``, ``sac-edge bench`` and the runtime API (``runtime.py``).

In order, each step producing a typed value and nothing assigned after construction: the config
validated (``validate``: every flag, once, before anything is opened; the runtime's options come out of
it), the verified bundle (``verified_bundle``),
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
import threading
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from sac_edge.common.bundle import Bundle, open_bundle
from sac_edge.common.bundle_format import ENVELOPE_KIND, FP32, PRECISIONS
from sac_edge.common.envelope import parse_envelope
from sac_edge.common.errors import SacEdgeError
from sac_edge.common.lockfile import pid_lock
from sac_edge.edge_runtime.backends.autoselect import Measurement, autoselect
from sac_edge.edge_runtime.backends.base import Backend, BackendOptions
from sac_edge.edge_runtime.backends.registry import open_backend, refusal
from sac_edge.edge_runtime.budget.governor import Governor, GovernorConfig, build_ladder
from sac_edge.edge_runtime.budget.memory import MemoryProbe
from sac_edge.edge_runtime.budget.monitor import BudgetMonitor
from sac_edge.edge_runtime.budget.sensors import NoPowerSensor, PowerSensor, detect_power_sensor
from sac_edge.edge_runtime.control.history import InputHistory
from sac_edge.edge_runtime.control.loop import error_line
from sac_edge.edge_runtime.control.safety import ActionGuard, ObservationGuard
from sac_edge.edge_runtime.control.shield import Shield
from sac_edge.edge_runtime.control.step import StepPipeline
from sac_edge.edge_runtime.finetune.finetuner import (
    FineTuner,
    TunerSetup,
    build_finetuner,
    finetune_dir,
    install_last_good,
)
from sac_edge.edge_runtime.finetune.promotion import LastGood, LastGoodStore
from sac_edge.edge_runtime.finetune.settings import FinetuneSettings
from sac_edge.edge_runtime.finetune.weight_swap import WeightSwapper

from .config import BenchConfig, RunConfig, RuntimeOptions
from .preflight import checked_bundle

Emit = typing.Callable[[typing.Dict[str, Any]], None]
Log = typing.Callable[[str], None]


def validate(cfg: RunConfig) -> RuntimeOptions:
    """Every flag's value, before the bundle, an env or a backend is opened (one line, exit 2), once: the
    scheduler's and the env's flags, then the runtime's options, which are returned (``RunConfig.check``)."""
    return cfg.check()


def finetune_settings(options: RuntimeOptions) -> FinetuneSettings:
    """The fine-tuning section and what the fine-tuner and the learner process read from the other options."""
    return FinetuneSettings(
        options.finetune,
        bundle=options.bundle,
        env=options.env,
        seed=options.seed,
        rate_hz=options.rate_hz,
        mem_budget_mb=options.budget.mem_budget_mb,
        cpus=options.cpus,
    )


def verified_bundle(cfg: RuntimeOptions | BenchConfig) -> Bundle:
    """``cfg.bundle`` opened with its checksums verified (and its signature, with ``--trusted-keys``), and its
    flags checked against it (``preflight.checked_bundle``)."""
    return checked_bundle(open_bundle(cfg.bundle, cfg.trusted_keys, allow_downgrade=cfg.allow_downgrade), cfg)


class LastGoodWeights(NamedTuple):
    """The fine-tuning directory's store (its lock held when fine-tuning) and the weights to start from."""

    store: LastGoodStore
    last: LastGood | None
    """With ``--resume``: the last good weights, checked; else None (the bundle's weights)."""


@contextlib.contextmanager
def last_good_weights(cfg: RuntimeOptions) -> Iterator[LastGoodWeights]:
    """The store and the weights to start from (with ``--resume``), with the fine-tuning directory's lock
    held throughout when fine-tuning: one fine-tuner per weights directory, or each would overwrite the
    other's."""
    store = LastGoodStore(finetune_dir(cfg.finetune, cfg.bundle))
    with contextlib.ExitStack() as held:
        if cfg.finetune.enabled:
            held.enter_context(pid_lock(store.lock, f"fine-tuning directory {store.dir}"))
            if store.holds_weights() and not (cfg.finetune.resume or cfg.finetune.restart):
                held_path = store.path if store.exists() else store.previous
                raise SacEdgeError(
                    f"{held_path} holds fine-tuned weights; pass --resume to continue from them or "
                    "--restart to start again from the bundle weights (they are then kept as previous.safetensors "
                    "at the first promotion)"
                )
        yield LastGoodWeights(store, store.load() if cfg.finetune.resume else None)


def open_backends(cfg: RuntimeOptions, bundle: Bundle, log: Log) -> tuple[dict[str, Backend], list[Measurement]]:
    """The serving backend, plus (with budgets) the same backend at each cheaper accepted precision."""
    section = cfg.backend
    options = BackendOptions(threads=section.threads, refit=cfg.finetune.enabled)
    measurements: list[Measurement] = []
    if section.kind == "auto":
        precisions = [section.precision] if section.precision else None
        backend, measurements = autoselect(bundle, options, precisions, calls=section.auto_calls, log=log)
    else:
        backend = open_backend(bundle, section.kind, section.precision or FP32, options)
    backends = {backend.precision: backend}
    if cfg.budget.any:
        cheaper = PRECISIONS[PRECISIONS.index(backend.precision) + 1 :]
        for precision in cheaper:
            if refusal(bundle, backend.name, precision) is None:
                backends[precision] = open_backend(bundle, backend.name, precision, options)
    return backends, measurements


def make_governor(
    cfg: RuntimeOptions, precisions: Sequence[str], finetune_batch: int | None, power_budget_w: float | None
) -> Governor | None:
    """The governor for ``cfg``'s budgets over ``precisions`` (serving one first), or None without budgets;
    ``power_budget_w`` is the power budget it enforces (``enforced_power_budget``)."""
    if not cfg.budget.any:
        return None
    ladder = build_ladder(
        cfg.rate_hz,
        precisions[0],
        list(precisions),
        finetune_batch=finetune_batch,
        min_finetune_batch=min(32, finetune_batch or 32),
    )
    return Governor(GovernorConfig(cfg.budget.mem_budget_mb, power_budget_w), ladder)


def power_sensor(cfg: RuntimeOptions, log: Log, who: str) -> tuple[PowerSensor | None, float | None]:
    """The power sensor a run reads (None: none is read or none is present) and the power budget the governor
    enforces on it: ``--power-budget-w`` on a measured reading, on an estimate only with
    ``--enforce-estimated-power`` (an estimate models the whole machine's CPU load: another process's work
    would lower this loop's rate). A budget that is not enforced is said in one line at the start, begun by
    ``who`` (the caller's name: ``sac-edge run``, the ROS 2 node, a robot's own loop)."""
    root, watts = Path(cfg.budget.sensor_root), cfg.budget.power_budget_w
    sensor = detect_power_sensor(root) if cfg.telemetry or watts is not None else None
    if isinstance(sensor, NoPowerSensor):
        if watts is not None:
            log(f"{who}: --power-budget-w {watts:g} cannot be enforced: {sensor.reason}")
        return None, None
    if sensor is None or watts is None or sensor.measured or cfg.budget.enforce_estimated_power:
        return sensor, watts
    log(
        f"{who}: --power-budget-w {watts:g} is not enforced: no power sensor is readable here, only an "
        f"estimate ({sensor.source}, from the whole machine's CPU load), recorded in telemetry; "
        "--enforce-estimated-power enforces it on the estimate"
    )
    return sensor, None


def make_shield(cfg: RuntimeOptions, bundle: Bundle, emit: Emit) -> Shield | None:
    """The shield for ``cfg`` on ``bundle`` (its envelope from the verified bytes), or None without shield
    options (``--shield guards``). Before the backends open: a flag that does not fit the bundle's dims is one
    line. A bundle without ``envelope.json`` (exported before it, or ``--no-envelope``) gets the rest of the
    shield; the summary's ``shield.envelope`` says so."""
    if cfg.shield is None:
        return None
    spec = bundle.spec
    cfg.shield.check(spec.act_dim)
    names = bundle.files(ENVELOPE_KIND)
    envelope = None
    if names:
        path = bundle.path / names[0]
        envelope = parse_envelope(bundle.read(path), path, bundle.frame_dim, spec.act_dim)
    return Shield(cfg.shield, spec.action_low, spec.action_high, envelope, emit)


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
    auto_measurements: list[Measurement]
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
        """The ``auto`` measurements as reported (without the kinds not installed here unless ``unavailable``)."""
        kept = (m for m in self.auto_measurements if unavailable or m.refusal is None or "unavailable" not in m.refusal)
        return [m._asdict() for m in kept]


def compose(
    cfg: RuntimeOptions,
    bundle: Bundle,
    weights: LastGoodWeights,
    shield: Shield | None,
    emit: Emit,
    log: Log,
    who: str,
) -> Composition:
    """Backends, probe, fine-tuner (its learner process started), governor, sensor and monitor for ``cfg``.

    ``weights`` come from :func:`last_good_weights`, ``shield``
    from :func:`make_shield`; ``who`` begins the lines logged (the caller's name)."""
    backends, measurements = open_backends(cfg, bundle, log)
    probe = MemoryProbe(Path(cfg.budget.sensor_root))
    last = weights.last
    precisions = list(backends)
    tuner, resumed = None, None
    sensor, watts = power_sensor(cfg, log, who)
    try:
        if cfg.finetune.enabled:
            tuner, resumed = build_finetuner(TunerSetup(
                finetune_settings(cfg), bundle, backends, probe, last, cfg.finetune.rules(),
                lambda batch: make_governor(cfg, precisions, batch, watts),
                listeners=[shield.weights_swapped] if shield is not None else [], store=weights.store,
            ), emit, log)  # fmt: skip
            governor = tuner.governor
        else:
            governor = make_governor(cfg, precisions, None, watts)
            if last is not None:
                resumed = install_last_good(WeightSwapper(backends, bundle), last)[1]
    except BaseException:
        if sensor is not None:
            sensor.close()
        raise
    monitor = BudgetMonitor(probe, sensor, governor)
    return Composition(backends, measurements, probe, shield, tuner, resumed, governor, sensor, monitor)


def step_pipeline(
    cfg: RuntimeOptions,
    bundle: Bundle,
    parts: Composition,
    obs_low: np.ndarray,
    obs_high: np.ndarray,
    running: dict[int, bool],
    scratch: bool = False,
    history: InputHistory | None = None,
) -> StepPipeline:
    """The step's stages for ``parts`` (guards on the observation bounds, the shield, the fine-tuner's
    exploration), the backend call watched through ``running``. ``scratch``: the same stages on state of
    their own (a shield that emits nothing, no exploration), for ``Runtime.warm_up`` to run the real step
    without changing what the step keeps."""
    shield = parts.shield
    if scratch and shield is not None:
        shield = Shield(shield.options, bundle.spec.action_low, bundle.spec.action_high, shield.envelope)
    inner = shield.obs_bounds if shield is not None else None
    obs_guard = ObservationGuard(obs_low, obs_high, cfg.obs_fault, inner, dtype=np.float32)
    act_guard = ActionGuard(np.array(bundle.spec.action_low), np.array(bundle.spec.action_high))
    explore = parts.tuner.explore if parts.tuner is not None and not scratch else None
    inputs = None if history is None else history.peek if scratch else history.inputs
    return StepPipeline(obs_guard, act_guard, shield, explore, running, cfg.max_backend_errors, error_line, inputs)
