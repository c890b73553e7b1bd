"""The resolved configuration of ``sac-edge run``, ``bench``, ``drill`` and ``doctor`` (field help becomes
``--help``), and the ``Runtime`` library's options.

``RunConfig`` is made of sections, one frozen dataclass each (backend, loop, shield, realtime, budget,
fine-tuning), whose fields are the flags of ``sac-edge run`` under their usual names. What the runtime works
from is ``RuntimeOptions`` (the backend, budget and fine-tuning sections, the shield's options or None, and
the few loop and realtime flags it uses), checked as a whole when made; ``RunConfig.runtime_options`` makes
them from the flags (``--shield guards``: no shield options), and ``RunConfig.check`` checks the scheduler's
and the env's own flags and then makes them, so each value is checked in one place, before a bundle is
opened. The saved config (telemetry's ``config`` record) nests each section under its name.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from sac_edge.common.atomic import check_new_file, check_output_path
from sac_edge.common.bundle_format import PRECISIONS
from sac_edge.common.config import check_fields, config_from_flags
from sac_edge.common.cpus import check_cpus, check_threads
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.backends.registry import BACKEND_CHOICES, KINDS
from sac_edge.edge_runtime.control.realtime import check_idle_latency
from sac_edge.edge_runtime.control.safety import OBS_FAULT_POLICIES
from sac_edge.edge_runtime.control.shield import SHIELD_MODES, ShieldOptions
from sac_edge.edge_runtime.finetune.finetuner import finetune_dir
from sac_edge.edge_runtime.finetune.settings import FinetuneSection

TRUSTED_KEYS_HELP = "directory of *.pub keys: refuse a bundle not signed by one of them (sac-export --sign-key)"
ALLOW_DOWNGRADE_HELP = (
    "with --trusted-keys, accept a bundle older than the newest one this device accepted from its key"
)


#: The fastest control rate accepted (a 10 us period; faster is not a control loop Python can keep).
MAX_RATE_HZ = 100_000.0
#: The slowest: one step every 1000 s (slower is not a control loop; the loop still sees a stop at once).
MIN_RATE_HZ = 1e-3
#: ``--realtime-priority``'s highest value (SCHED_FIFO's range is 1..99; 0: off).
MAX_REALTIME_PRIORITY = 99
#: The longest ``--duration`` other than 0 (run until stopped): about 31 years.
MAX_DURATION_S = 1e9
#: The longest busy-wait before a slot and the longest inference watchdog limit.
MAX_SPIN_US, MAX_INFERENCE_TIMEOUT_S = 1e6, 3600.0


#: Timed calls per candidate of ``--backend auto`` at most: its timings are kept, and the loop waits for them
#: (1e12 was a MemoryError, 1e8 an hour's probing before the first step).
MAX_AUTO_CALLS = 100_000


@dataclass(frozen=True)
class BackendSection:
    """Which inference backend serves, at which precision."""

    kind: str = field(
        default="auto",
        metadata={
            "flag": "--backend",
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
    threads: int = field(default=1, metadata={"help": "intra-op threads for the inference backend"})
    auto_calls: int = field(
        default=200, metadata={"help": f"timed calls per candidate for --backend auto (1 to {MAX_AUTO_CALLS})"}
    )

    def check(self) -> None:
        """``--backend``, ``--precision``, ``--threads``, ``--auto-calls``."""
        check_fields(self)
        check_threads(self.threads)
        if not 1 <= self.auto_calls <= MAX_AUTO_CALLS:
            raise SacEdgeError(
                f"--auto-calls must be from 1 to {MAX_AUTO_CALLS} (timed calls per candidate before the loop "
                f"starts; `sac-edge bench --calls` measures longer), got {self.auto_calls}"
            )


@dataclass(frozen=True)
class LoopSection:
    """The control loop's schedule and what it does when a step goes wrong."""

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
            "help": "run the step on scratch state (guards, inference, shield) just before each slot, so its "
            "code and weights are in the caches when the real one runs (costs up to a quarter period of CPU)"
        },
    )

    def check(self) -> None:
        """The scheduler's own flags (``--duration``, ``--spin-us``); the rest are the runtime's
        (``RuntimeOptions.check``)."""
        check_fields(self)
        if not 0 <= self.duration <= MAX_DURATION_S:
            raise SacEdgeError(
                f"--duration must be from 0 (run until stopped) to {MAX_DURATION_S:g} seconds, got {self.duration}"
            )
        if not 0 <= self.spin_us <= MAX_SPIN_US:
            raise SacEdgeError(f"--spin-us must be from 0 to {MAX_SPIN_US:g} microseconds, got {self.spin_us}")


@dataclass(frozen=True)
class ShieldSection:
    """Whether the safety shield runs after the guards, and its knobs (envelope, stuck sensors,
    fallback, ramp, slew limit).

    ``sac-edge run``'s ``--shield`` switch beside the shield's options (``ShieldOptions``, whose flags are
    this group's and whose values the saved config keeps in this section's object). The runtime takes the
    options, or None with ``--shield guards`` (``runtime_shield``); ``sac-edge drill`` has the options alone
    (it runs both)."""

    options: ShieldOptions = field(default_factory=ShieldOptions, metadata={"inline": True})
    mode: str = field(
        default="on",
        metadata={
            "flag": "--shield",
            "help": "on: the safety shield after the guards (the bundle's observation envelope, stuck sensors, "
            "fallback, blend-in ramp, slew limit); guards: the observation and action guards alone",
            "choices": list(SHIELD_MODES),
        },
    )
    """``on``: a ``Shield`` after the guards; ``guards``: the observation and action guards alone."""

    def runtime_shield(self) -> ShieldOptions | None:
        """The shield's options with ``--shield on``, None with ``guards`` (``RuntimeOptions.shield``); the
        switch is checked here, the options with the runtime's (``RuntimeOptions.check``)."""
        check_fields(self)
        return self.options if self.mode == "on" else None


@dataclass(frozen=True)
class RealtimeSection:
    """The control thread's priority, CPUs, memory locking and the CPUs' idle states."""

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

    @property
    def idle_cap_us(self) -> int | None:
        """The idle-latency cap the loop holds: ``--idle-latency-us``, else 0 with a priority (a real-time
        loop's wake-ups are what the priority is for), else None (the kernel's choice)."""
        if self.idle_latency_us is None and self.realtime_priority:
            return 0
        return self.idle_latency_us

    def check(self) -> None:
        """The priority and the idle-latency cap (``--cpus`` is the runtime's: ``RuntimeOptions.check``)."""
        check_fields(self)
        if not 0 <= self.realtime_priority <= MAX_REALTIME_PRIORITY:
            raise SacEdgeError(
                f"--realtime-priority must be 1..{MAX_REALTIME_PRIORITY} (0: off), got {self.realtime_priority}"
            )
        if self.idle_latency_us is not None:
            check_idle_latency(self.idle_latency_us)


@dataclass(frozen=True)
class BudgetSection:
    """Memory and power budgets the governor enforces, and where their sensors are read."""

    mem_budget_mb: float | None = field(default=None, metadata={"help": "memory budget enforced by the governor"})
    power_budget_w: float | None = field(
        default=None,
        metadata={
            "help": "power budget enforced by the governor on a measured reading (see --enforce-estimated-power)"
        },
    )
    enforce_estimated_power: bool = field(
        default=False,
        metadata={
            "help": "enforce --power-budget-w on the estimate where no power sensor is readable (a model of the "
            "whole machine's CPU load, other processes included); without it the estimate is only recorded"
        },
    )
    sensor_root: str = field(default="/", metadata={"help": "filesystem root the power/memory sensors read"})

    @property
    def any(self) -> bool:
        """Whether a budget is set (and so the governor runs)."""
        return self.mem_budget_mb is not None or self.power_budget_w is not None

    def check(self) -> None:
        """Each budget is positive."""
        check_fields(self)
        for flag, budget in (("--mem-budget-mb", self.mem_budget_mb), ("--power-budget-w", self.power_budget_w)):
            if budget is not None and not 0 < budget < math.inf:
                raise SacEdgeError(f"{flag} must be a positive number, got {budget}")
        if not os.path.isdir(self.sensor_root):
            raise SacEdgeError(f"--sensor-root {self.sensor_root!r} is not a directory; pass / on the device")


@dataclass(frozen=True)
class RuntimeOptions:
    """What ``Runtime`` works from (``runtime.py``) and nothing else, checked as a whole when made: a bad
    value is one ``SacEdgeError`` line naming its ``sac-edge run`` flag, before anything is opened.

    A robot's own loop makes them directly, ``RuntimeOptions("bundles/pend", rate_hz=100,
    finetune=FinetuneSection(enabled=True))``, or with the flags' names flat, ``RuntimeOptions.of(
    "bundles/pend", rate_hz=100, finetune=True)``; ``sac-edge run`` makes them from its flags
    (``RunConfig.runtime_options``). The sections are ``RunConfig``'s own; ``shield`` is the shield's options
    (``ShieldOptions``), None for the guards alone."""

    bundle: str
    """The bundle directory written by ``sac-export``."""
    trusted_keys: str | None = None
    """A directory of ``*.pub`` keys: refuse a bundle not signed by one of them."""
    allow_downgrade: bool = False
    """With ``trusted_keys``, accept a bundle older than the newest one this device accepted from its key."""
    telemetry: str | None = None
    """A JSONL file: the config, one record per ``tick``, every governor and shield event, the summary."""
    overwrite_telemetry: bool = False
    """Replace an existing ``telemetry`` file (otherwise it is refused)."""
    rate_hz: float = 100.0
    """The rate the caller runs at: the period ``inference_budget`` is a fraction of, the learner's sizing,
    the governor's top rung."""
    obs_fault: str = field(default="clip", metadata={"choices": list(OBS_FAULT_POLICIES)})
    """A bad observation: ``clip`` (repaired: the last good value, clipped to the bounds) or ``hold`` (the
    last safe action)."""
    inference_budget: float = 0.5
    """The fraction of the period an inference may take; a slower one sends the last safe action."""
    inference_timeout: float = 2.0
    """Seconds one inference may run before the inference watchdog stops the runtime (``HangPolicy``)."""
    max_backend_errors: int = 10
    """Failed inferences (each one sends the last safe action) after which ``act`` stops serving."""
    cpus: tuple[int, ...] = ()
    """The CPUs the caller's control loop runs on: the learner process keeps off them."""
    env: str | None = None
    """The env recorded with promoted fine-tuned weights (None: the bundle's)."""
    seed: int = 0
    """Seeds fine-tuning: the exploration noise and the learner."""
    backend: BackendSection = field(default_factory=BackendSection)
    shield: ShieldOptions | None = field(default_factory=ShieldOptions)
    """The safety shield after the guards; None: the observation and action guards alone (``--shield
    guards``)."""
    budget: BudgetSection = field(default_factory=BudgetSection)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def of(cls, bundle: str, *, shield: str = "on", **flags: Any) -> RuntimeOptions:
        """The options from ``flags`` named as ``sac-edge run``'s flags (``rate_hz=100`` for ``--rate-hz 100``,
        ``finetune=True`` for ``--finetune``, ``shield="guards"`` for ``--shield guards``), each put in its
        section."""
        made = config_from_flags(cls, {"bundle": bundle, **flags}, "RuntimeOptions.of")
        if ShieldSection(mode=shield).runtime_shield() is None:  # the switch checked as sac-edge run checks it
            return dataclasses.replace(made, shield=None)
        return made

    def check(self) -> None:
        """Every value (one line naming its flag): the step's limits, the CPUs, the seed, each section's own
        check, then the files the runtime will write."""
        check_fields(self)
        if not MIN_RATE_HZ <= self.rate_hz <= MAX_RATE_HZ:
            raise SacEdgeError(
                f"--rate-hz must be from {MIN_RATE_HZ:g} to {MAX_RATE_HZ:g} steps per second, got {self.rate_hz}"
            )
        if not 0 < self.inference_budget <= 1:
            raise SacEdgeError(f"--inference-budget is a fraction of the period in (0, 1], got {self.inference_budget}")
        if not 0 < self.inference_timeout <= MAX_INFERENCE_TIMEOUT_S:
            raise SacEdgeError(
                f"--inference-timeout must be more than 0 and at most {MAX_INFERENCE_TIMEOUT_S:g} seconds, "
                f"got {self.inference_timeout}"
            )
        if self.max_backend_errors < 1:
            raise SacEdgeError(f"--max-backend-errors must be at least 1, got {self.max_backend_errors}")
        if any(cpu < 0 for cpu in self.cpus):
            raise SacEdgeError(f"--cpus takes CPU numbers from 0, got {','.join(map(str, self.cpus))}")
        check_cpus(self.cpus)
        if not 0 <= self.seed < 2**64:
            raise SacEdgeError(f"--seed must be from 0 to 2**64 - 1 (numpy's seeds), got {self.seed}")
        for section in (self.backend, self.shield, self.budget, self.finetune):
            if section is not None:  # no shield: the guards alone
                section.check()
        self._check_memory_source()
        self._check_files()

    def _check_memory_source(self) -> None:
        """The memory budget and fine-tuning read this process's resident memory under ``--sensor-root``."""
        if not (self.finetune.enabled or self.budget.mem_budget_mb is not None):
            return
        status = os.path.join(self.budget.sensor_root, "proc", str(os.getpid()), "status")
        if not os.path.isfile(status):
            raise SacEdgeError(
                f"--sensor-root {self.budget.sensor_root!r} has no proc/<pid>/status for this process, which "
                "--mem-budget-mb and --finetune read; leave --sensor-root out (it defaults to /)"
            )

    def _check_files(self) -> None:
        """The telemetry file and, with fine-tuning, its directory: writable, and nothing replaced unasked."""
        if self.telemetry is not None:
            check_new_file(
                self.telemetry, "--telemetry", replace=self.overwrite_telemetry, replace_flag="--overwrite-telemetry"
            )
            if os.path.islink(self.telemetry) or (
                os.path.lexists(self.telemetry) and not os.path.isfile(self.telemetry)
            ):
                raise SacEdgeError(
                    f"--telemetry {self.telemetry} is a symlink or not a regular file; choose another path"
                )
        if self.finetune.enabled:  # a read-only bundle would otherwise fail at the lock, after the bundle was verified
            check_output_path(finetune_dir(self.finetune, self.bundle), "--finetune-dir", directory=True)


@dataclass(frozen=True)
class RunConfig:
    """``sac-edge run BUNDLE``: drive an environment with the bundle's policy at a fixed rate."""

    bundle: str = field(metadata={"help": "bundle directory written by sac-export"})
    env: str | None = field(
        default=None,
        metadata={"help": "gymnasium id or module:Class (any gymnasium Env API class); default: the bundle's env"},
    )
    seed: int = field(default=0, metadata={"help": "environment reset seed"})
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
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    verbose: bool = field(default=False, metadata={"help": "let library warnings through to stderr"})
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object on the last line"})
    backend: BackendSection = field(default_factory=BackendSection)
    loop: LoopSection = field(default_factory=LoopSection)
    shield: ShieldSection = field(default_factory=ShieldSection)
    realtime: RealtimeSection = field(default_factory=RealtimeSection)
    budget: BudgetSection = field(default_factory=BudgetSection)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)

    @classmethod
    def of(cls, bundle: str, **flags: Any) -> RunConfig:
        """The config ``sac-edge run BUNDLE`` makes from ``flags`` named as its flags (``rate_hz=100`` for
        ``--rate-hz 100``, ``finetune=True`` for ``--finetune``), each put in its section."""
        return config_from_flags(cls, {"bundle": bundle, **flags}, "RunConfig.of")

    def runtime_options(self) -> RuntimeOptions:
        """The flags the runtime works from, as its options (checked as they are made)."""
        loop = self.loop
        return RuntimeOptions(
            bundle=self.bundle,
            trusted_keys=self.trusted_keys,
            allow_downgrade=self.allow_downgrade,
            telemetry=self.telemetry,
            overwrite_telemetry=self.overwrite_telemetry,
            rate_hz=loop.rate_hz,
            obs_fault=loop.obs_fault,
            inference_budget=loop.inference_budget,
            inference_timeout=loop.inference_timeout,
            max_backend_errors=loop.max_backend_errors,
            cpus=self.realtime.cpus,
            env=self.env,
            seed=self.seed,
            backend=self.backend,
            shield=self.shield.runtime_shield(),
            budget=self.budget,
            finetune=self.finetune,
        )

    def check(self) -> RuntimeOptions:
        """Every flag's value, before the bundle, an env or a backend is opened (one line, exit 2): the
        scheduler's and the env's here, then the runtime's as its options are made; returns those options."""
        check_fields(self)
        self.loop.check()
        self.realtime.check()
        if self.shift:  # gymnasium is only imported to read a --shift
            from sac_edge.edge_runtime.finetune.shift import parse_shift

            parse_shift(self.shift)
        return self.runtime_options()


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
    overwrite: bool = field(
        default=False, metadata={"help": "replace an existing --out or --plot file (otherwise it is refused)"}
    )
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
    action_delay_steps: int = field(
        default=0,
        metadata={
            "help": "delay: from the onset each action also reaches the env this many control steps late (the "
            "delay a policy trained with sac-train --action-delay expects; 0: the observation alone)"
        },
    )
    ood_scale: float = field(
        default=10.0, metadata={"help": "ood_start: std of the push (MuJoCo: added to joint velocities)"}
    )
    backend: str = field(
        default="onnxruntime", metadata={"help": "inference backend", "choices": list(BACKEND_CHOICES)}
    )
    seed: int = field(default=1000, metadata={"help": "first episode seed"})
    out: str | None = field(default=None, metadata={"help": "write the rows and checks to this JSON file"})
    save: bool = field(default=False, metadata={"help": "write them beside the bundle, as BUNDLE.drill.json"})
    overwrite: bool = field(
        default=False, metadata={"help": "replace an existing --out or --save file (otherwise it is refused)"}
    )
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    json: bool = field(default=False, metadata={"help": "print the results as one JSON object on the last line"})
    shield: ShieldOptions = field(default_factory=ShieldOptions)


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


@dataclass(frozen=True)
class ReplayConfig:
    """``sac-edge replay BUNDLE RECORDING``: check a bundle against a robot's recorded log before the policy
    commands it. Each recorded state goes through the bundle's layout (as the ROS 2 node gathers it) and the
    policy (the bundle's backends); the log is compared with the training distribution, the policy's actions
    and the robot's own motion, and each finding names its joints (swapped, sign, scale, frozen,
    out_of_range, stale). Exit 0: the log agrees; 3: a mismatch; 2: bad input."""

    bundle: str = field(metadata={"help": "bundle directory written by sac-export with --layout"})
    recording: str = field(
        metadata={"help": "MCAP file, rosbag2 directory (ros2 bag record -s mcap) or the node's record"}
    )
    state_topic: str = field(default="/joint_states", metadata={"help": "the sensor_msgs/JointState topic"})
    command_topic: str = field(
        default="/forward_command_controller/commands",
        metadata={"help": "the robot's std_msgs/Float64MultiArray commands (compared where the log has them)"},
    )
    vs: str | None = field(
        default=None,
        metadata={"help": "a second bundle run on the same log: per-joint divergence and each one's shield steps"},
    )
    plot: str | None = field(
        default=None, metadata={"help": "PNG: per joint, recorded vs training range and policy vs robot command"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --plot file"})
    backend: str = field(
        default="onnxruntime", metadata={"help": "inference backend", "choices": list(BACKEND_CHOICES)}
    )
    precision: str | None = field(
        default=None, metadata={"help": "precision to run (default fp32)", "choices": list(PRECISIONS)}
    )
    trusted_keys: str | None = field(default=None, metadata={"help": TRUSTED_KEYS_HELP})
    allow_downgrade: bool = field(default=False, metadata={"help": ALLOW_DOWNGRADE_HELP})
    verbose: bool = field(default=False, metadata={"help": "let library warnings through to stderr"})
    json: bool = field(default=False, metadata={"help": "print the report as one JSON object on the last line"})

    def check(self) -> None:
        """Every flag, before a bundle or the recording is opened."""
        check_fields(self)
        if self.plot is not None:
            if not self.plot.endswith(".png"):
                raise SacEdgeError(f"--plot {self.plot}: the plot is a PNG; give a .png path")
            check_new_file(self.plot, "--plot", replace=self.overwrite, replace_flag="--overwrite")
        if not self.state_topic or not self.command_topic:
            raise SacEdgeError("--state-topic and --command-topic name topics; give non-empty names")

    def runtime_options(self, bundle: str) -> RuntimeOptions:
        """The runtime's options for replaying through ``bundle``: its backend and precision, the default
        shield, and the slowest rate (a log is replayed as fast as it reads; no step may overrun)."""
        return RuntimeOptions.of(
            bundle,
            trusted_keys=self.trusted_keys,
            allow_downgrade=self.allow_downgrade,
            backend=self.backend,
            precision=self.precision,
            rate_hz=MIN_RATE_HZ,
            inference_timeout=MAX_INFERENCE_TIMEOUT_S,
        )
