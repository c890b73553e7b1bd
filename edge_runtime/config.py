"""The resolved configuration of ``sac-edge run`` and ``sac-edge bench`` (field help becomes ``--help``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sac_edge.common.bundle_format import PRECISIONS
from sac_edge.edge_runtime.backends.registry import BACKEND_CHOICES, KINDS
from sac_edge.edge_runtime.control.safety import OBS_FAULT_POLICIES
from sac_edge.edge_runtime.control.shield import FALLBACKS, SHIELD_MODES

TRUSTED_KEYS_HELP = "directory of *.pub keys: refuse a bundle not signed by one of them (sac-export --sign-key)"
ALLOW_DOWNGRADE_HELP = (
    "with --trusted-keys, accept a bundle older than the newest one this device accepted from its key"
)


_SHIELD_FIELDS: dict[str, dict[str, Any]] = {
    "shield_window": {
        "default": 3,
        "metadata": {
            "help": "consecutive steps outside the envelope that switch to the fallback (0: no envelope check)"
        },
    },
    "stuck_steps": {
        "default": 5,
        "metadata": {"help": "bit-identical observations in a row that flag a stuck sensor (0: off)"},
    },
    "ramp_steps": {
        "default": 5,
        "metadata": {"help": "steps of the blend-in ramp at start, after a fallback and after a weight swap (0: none)"},
    },
    "fallback": {
        "default": "hold",
        "metadata": {
            "help": "fallback action: hold (the last action sent on familiar ground) or fixed (--safe-action, "
            "else the bundle's)",
            "choices": list(FALLBACKS),
        },
    },
    "safe_action": {
        "default": (),
        "metadata": {"help": "the fixed fallback action and the ramp's start, one number per action dim"},
    },
    "slew": {
        "default": (),
        "metadata": {
            "help": "largest action change per step, one value or one per dim (default: the bundle's, from "
            "the policy's rollouts at export; 0: no limit)"
        },
    },
}
"""The shield's flags, shared by ``sac-edge run`` and ``sac-edge drill`` (one help text each)."""


def shield_field(name: str) -> Any:
    """A fresh ``field`` for the shield flag ``name`` (each dataclass needs its own Field object)."""
    return field(**_SHIELD_FIELDS[name])


@dataclass(frozen=True)
class RunConfig:
    """``sac-edge run BUNDLE``: drive an environment with the bundle's policy at a fixed rate."""

    bundle: str = field(metadata={"help": "bundle directory written by sac-export"})
    env: str | None = field(
        default=None,
        metadata={"help": "gymnasium id or module:Class (any gymnasium Env API class); default: the bundle's env"},
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": "inference backend; auto times each usable one at start-up and keeps the lowest p99",
            "choices": list(BACKEND_CHOICES),
        },
    )
    precision: str | None = field(
        default=None,
        metadata={
            "help": "precision to run; default fp32 for a named backend, every gated one for auto",
            "choices": list(PRECISIONS),
        },
    )
    rate_hz: float = field(default=100.0, metadata={"help": "control rate (steps per second)"})
    duration: float = field(default=10.0, metadata={"help": "seconds to run; 0 runs until Ctrl-C or SIGTERM"})
    obs_fault: str = field(
        default="clip",
        metadata={
            "help": "bad observation policy: clip (repair: last good value, clip to bounds) or hold "
            "(keep the last safe action)",
            "choices": list(OBS_FAULT_POLICIES),
        },
    )
    inference_budget: float = field(
        default=0.5, metadata={"help": "fraction of the period an inference may take; slower ones hold the action"}
    )
    shield: str = field(
        default="on",
        metadata={
            "help": "on: the safety shield after the guards (the bundle's observation envelope, stuck sensors, "
            "fallback, blend-in ramp, slew limit); guards: the observation and action guards alone",
            "choices": list(SHIELD_MODES),
        },
    )
    shield_window: int = shield_field("shield_window")
    stuck_steps: int = shield_field("stuck_steps")
    ramp_steps: int = shield_field("ramp_steps")
    fallback: str = shield_field("fallback")
    safe_action: tuple[float, ...] = shield_field("safe_action")
    slew: tuple[float, ...] = shield_field("slew")
    inference_timeout: float = field(
        default=2.0,
        metadata={
            "help": "seconds one inference may run before the watchdog holds the last safe action and ends the "
            "run with its summary (a graph that never returns)"
        },
    )
    max_backend_errors: int = field(
        default=10,
        metadata={
            "help": "failed inferences (each one holds the last safe action) after which the run ends with its summary"
        },
    )
    spin_us: float = field(default=100.0, metadata={"help": "busy-wait this long before each slot (sleep before)"})
    warm_cache: bool = field(
        default=True,
        metadata={
            "help": "rehearse the step (guards and inference on its observation) just before each slot, so "
            "its code and weights are in the caches when the real one runs (costs up to a quarter period of CPU)"
        },
    )
    realtime_priority: int = field(
        default=0,
        metadata={"help": "SCHED_FIFO priority 1..99 for the control thread (needs root or CAP_SYS_NICE); 0: off"},
    )
    idle_latency_us: int | None = field(
        default=None,
        metadata={
            "help": "while the loop runs, keep every CPU out of idle states slower to leave than this (PM QoS "
            "/dev/cpu_dma_latency; 0: the cores never sleep: fastest wake-ups, most idle power); default: 0 "
            "with --realtime-priority, else the kernel's choice"
        },
    )
    lock_memory: bool = field(
        default=False, metadata={"help": "mlockall: no page faults in the loop, but reserved memory counts as RSS"}
    )
    cpus: tuple[int, ...] = field(default=(), metadata={"help": "pin the control loop to these CPUs, e.g. 3 or 2,3"})
    mem_budget_mb: float | None = field(default=None, metadata={"help": "memory budget enforced by the governor"})
    power_budget_w: float | None = field(default=None, metadata={"help": "power budget enforced by the governor"})
    finetune: bool = field(
        default=False,
        metadata={"help": "fine-tune on the device while running (SAC in a learner process; needs torch)"},
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "start from the last good fine-tuned weights in --finetune-dir (served; with --finetune also "
            "learned from)"
        },
    )
    restart: bool = field(
        default=False,
        metadata={
            "help": "with --finetune, start again from the bundle weights although last good fine-tuned weights "
            "exist (they are kept as the previous generation until a candidate is promoted)"
        },
    )
    finetune_dir: str | None = field(
        default=None, metadata={"help": "where the last good weights are kept (default: BUNDLE/finetune)"}
    )
    finetune_buffer: int = field(
        default=200_000, metadata={"help": "replay rows wanted; --mem-budget-mb may choose fewer"}
    )
    finetune_batch: int = field(
        default=256, metadata={"help": "minibatch wanted; --mem-budget-mb or the governor may choose less"}
    )
    finetune_utd: float = field(
        default=1.0,
        metadata={"help": "updates per collected step wanted; capped so updates use at most --learner-cpu of a core"},
    )
    learner_cpu: float = field(
        default=0.6, metadata={"help": "fraction of one core the learner's updates may take at --rate-hz"}
    )
    finetune_lr: float = field(default=3e-4, metadata={"help": "actor, critic and temperature learning rate"})
    learning_starts: int = field(default=1000, metadata={"help": "transitions collected before the first update"})
    swap_every: int = field(default=500, metadata={"help": "updates between candidate policies (K)"})
    promotion_window: int = field(
        default=8,
        metadata={"help": "episodes served by a candidate, compared with as many served by the last good weights"},
    )
    rollback_threshold: float = field(
        default=0.25,
        metadata={
            "help": "roll back when the candidate's mean return is below the last good one's by more than this "
            "fraction of |last good mean| (at least 1)"
        },
    )
    rollback_noise_z: float = field(
        default=2.0,
        metadata={
            "help": "...and by more than this many standard errors of the difference of the two windows' means, "
            "so that episode-to-episode noise is not mistaken for a regression (0: the threshold alone)"
        },
    )
    shadow_max_diff: float = field(
        default=0.5,
        metadata={
            "help": "refuse to serve a candidate whose mean action differs from the last good one's by more than "
            "this fraction of the action range on recent states"
        },
    )
    explore_std: float = field(
        default=0.1,
        metadata={"help": "exploration noise while fine-tuning, std as a fraction of the half action range (0: off)"},
    )
    shift: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "change the env's dynamics (tests, demos): NAME=VALUE,... e.g. g=13 (Pendulum gravity; also m, l), "
            "friction=0.5 or mass=1.2 (MuJoCo scales)"
        },
    )
    telemetry: str | None = field(
        default=None, metadata={"help": "JSONL file: the config, one record per second and every governor event"}
    )
    overwrite_telemetry: bool = field(
        default=False, metadata={"help": "replace an existing --telemetry file (otherwise it is refused)"}
    )
    threads: int = field(default=1, metadata={"help": "intra-op threads for the inference backend"})
    auto_calls: int = field(default=200, metadata={"help": "timed calls per candidate for --backend auto"})
    sensor_root: str = field(default="/", metadata={"help": "filesystem root the power/memory sensors read"})
    seed: int = field(default=0, metadata={"help": "environment reset seed"})
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    verbose: bool = field(default=False, metadata={"help": "let library warnings through to stderr"})
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object on the last line"})


@dataclass(frozen=True)
class BenchConfig:
    """``sac-edge bench BUNDLE``: latency, throughput, energy and memory per backend x precision x batch."""

    bundle: str = field(metadata={"help": "bundle directory written by sac-export"})
    backends: tuple[str, ...] = field(
        default=(), metadata={"help": f"backends to measure (default: every usable one of {', '.join(KINDS)})"}
    )
    precisions: tuple[str, ...] = field(
        default=(), metadata={"help": "precisions to measure (default: every one the bundle has and the gate passed)"}
    )
    batch: tuple[int, ...] = field(default=(1, 8, 64), metadata={"help": "batch sizes"})
    calls: int = field(default=500, metadata={"help": "timed calls per row"})
    warmup: int = field(default=50, metadata={"help": "untimed calls before each row"})
    threads: int = field(default=1, metadata={"help": "intra-op threads for the backends"})
    out: str | None = field(default=None, metadata={"help": "write the rows (and the config) to this JSON file"})
    plot: str | None = field(default=None, metadata={"help": "PNG: latency distributions and power over time"})
    sensor_root: str = field(default="/", metadata={"help": "filesystem root the power sensors read"})
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    verbose: bool = field(default=False, metadata={"help": "let library warnings through to stderr"})
    json: bool = field(default=False, metadata={"help": "print the rows as one JSON object on the last line"})


@dataclass(frozen=True)
class DrillConfig:
    """``sac-edge drill BUNDLE``: inject sensor faults into an env and measure the policy with and without the
    shield on the same seeds."""

    bundle: str = field(metadata={"help": "bundle directory written by sac-export"})
    env: str | None = field(
        default=None, metadata={"help": "gymnasium id or module:Class to drill in; default: the bundle's env"}
    )
    faults: tuple[str, ...] = field(
        default=(),
        metadata={"help": "faults to run: none,nan,stuck,spike,drop,delay,ood_start,swap (default: all of them)"},
    )
    episodes: int = field(default=3, metadata={"help": "seeded episodes per fault and mode (seeds --seed, +1, ...)"})
    max_steps: int = field(default=0, metadata={"help": "steps per episode at most (0: the env's time limit)"})
    fault_start: int = field(default=50, metadata={"help": "the step the fault starts at (the swap's step)"})
    fault_steps: int = field(default=10, metadata={"help": "how long a nan, stuck, spike or drop burst lasts"})
    fault_dim: int = field(default=0, metadata={"help": "the observation dimension nan and spike hit"})
    spike_sigma: float = field(
        default=8.0, metadata={"help": "spike size in standard deviations of the training states"}
    )
    drop_rate: float = field(
        default=0.5, metadata={"help": "probability that an observation of the drop burst is dropped"}
    )
    delay_steps: int = field(
        default=3, metadata={"help": "delay: the observation is this many steps old from the onset"}
    )
    ood_scale: float = field(
        default=10.0, metadata={"help": "ood_start: std of the push (MuJoCo: added to joint velocities)"}
    )
    backend: str = field(
        default="onnxruntime", metadata={"help": "inference backend", "choices": list(BACKEND_CHOICES)}
    )
    shield_window: int = shield_field("shield_window")
    stuck_steps: int = shield_field("stuck_steps")
    ramp_steps: int = shield_field("ramp_steps")
    fallback: str = shield_field("fallback")
    safe_action: tuple[float, ...] = shield_field("safe_action")
    slew: tuple[float, ...] = shield_field("slew")
    seed: int = field(default=1000, metadata={"help": "first episode seed"})
    out: str | None = field(default=None, metadata={"help": "write the rows and checks to this JSON file"})
    save: bool = field(default=False, metadata={"help": "write them beside the bundle, as BUNDLE.drill.json"})
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    json: bool = field(default=False, metadata={"help": "print the results as one JSON object on the last line"})


@dataclass(frozen=True)
class DoctorConfig:
    """``sac-edge doctor [BUNDLE]``: what this device is and, with a bundle, which backend x precision will run."""

    bundle: str | None = field(
        default=None, metadata={"help": "bundle directory written by sac-export (optional: the device alone)"}
    )
    sensor_root: str = field(
        default="/", metadata={"help": "filesystem root the device files are read under (a copied device tree)"}
    )
    trusted_keys: str | None = field(
        default=None,
        metadata={"help": "directory of trusted public keys: report whether the bundle's signature verifies"},
    )
    json: bool = field(default=False, metadata={"help": "print the rows as one JSON object on the last line"})
