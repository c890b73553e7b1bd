"""``sac-train``'s one frozen config. Field help texts become ``--help``; the resolved config is saved as
``config.json`` in the run dir. Defaults are the CleanRL / Stable-Baselines3 SAC defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sac_edge.common.config import flag_of
from sac_edge.common.cpus import usable_cpus
from sac_edge.common.errors import SacEdgeError

#: What ``--resume`` takes from the command line; every other setting is the run's saved one.
RESUME_TAKES = ("out", "total_steps", "threads", "log_every", "profile", "price_per_hour", "progress", "json")


@dataclass(frozen=True)
class TrainConfig:
    env: str | None = field(
        default=None, metadata={"help": "gymnasium id or module:Class (default Pendulum-v1; on --resume the run's env)"}
    )
    total_steps: int = field(default=15_000, metadata={"help": "environment steps in total (all envs)"})
    seed: int = field(default=0, metadata={"help": "seed for torch, numpy and the environments"})
    learning_starts: int = field(default=5_000, metadata={"help": "random-action steps before the first update"})
    num_envs: int = field(default=1, metadata={"help": "parallel gymnasium vector environments"})
    vector_mode: str = field(
        default="sync",
        metadata={"help": "vector env backend (async runs each env in its own process)", "choices": ["sync", "async"]},
    )
    device: str = field(default="cpu", metadata={"help": "training device", "choices": ["cpu", "cuda"]})
    amp: str = field(
        default="auto",
        metadata={
            "help": "precision of the networks' matmuls (fp16 uses a GradScaler); auto: bf16 where the device has "
            "bf16 matrix units (CUDA with bf16, a CPU with AVX512-BF16 or AMX), off (fp32) elsewhere",
            "choices": ["auto", "off", "bf16", "fp16"],
        },
    )
    backward: str = field(
        default="auto",
        metadata={
            "help": "how gradients are computed: manual (hand-written, faster on a CPU) or autograd (the "
            "reference; needed by --amp fp16, --cuda-graphs, --grad-checkpoint); auto: manual on a CPU unless one "
            "of those is asked for, autograd on CUDA",
            "choices": ["auto", "manual", "autograd"],
        },
    )
    compile: str = field(
        default="auto",
        metadata={
            "help": "torch.compile the update step (bare --compile: on, --no-compile: off); auto: on when the run has "
            "enough updates to repay the compile time",
            "choices": ["auto", "on", "off"],
            "const": "on",
            "no_const": "off",
        },
    )
    cuda_graphs: bool = field(default=False, metadata={"help": "capture the whole update in a CUDA graph (cuda only)"})
    buffer_size: int = field(default=1_000_000, metadata={"help": "replay capacity (preallocated on the device)"})
    batch_size: int = field(default=256, metadata={"help": "minibatch size per update"})
    hidden: tuple[int, ...] = field(default=(256, 256), metadata={"help": "actor hidden layer widths"})
    critic_layers: int = field(default=2, metadata={"help": "hidden layers in each critic (width: last of --hidden)"})
    grad_checkpoint: bool = field(
        default=False,
        metadata={
            "help": "recompute the critics' hidden activations during backward instead of keeping them (runs the "
            "autograd backward): measured a quarter to a third less working memory than autograd alone at 8 critic "
            "layers, at 0.67-0.87x its speed; a tenth to a fifth at 2 layers, where sac-train warns; refused at 1 "
            "(BENCHMARKS.md, 'Working memory and gradient checkpointing')"
        },
    )
    last_action: bool = field(
        default=False,
        metadata={
            "help": "the policy also sees the action it sent last (in its own units, [-1, 1]); the run dir and "
            "the bundle record it and the runtime assembles it (docs/CONTRACTS.md, 'Observation contract')"
        },
    )
    obs_history: int = field(
        default=0,
        metadata={
            "help": "the policy also sees the N env frames before the current one, oldest first, recorded and "
            "assembled as --last-action (0: none)"
        },
    )
    action_delay: str = field(
        default="",
        metadata={
            "help": "train with each action applied K control steps late (A-B: a delay drawn per episode from "
            "A..B); turns --last-action on with the K most recent actions (K the largest delay); recorded in the "
            "run dir and the bundle",
            "metavar": "K|A-B",
        },
    )
    delay_profile: str = field(
        default="",
        metadata={
            "help": "train under the delay measured on the device: FILE is the --json of sac-edge bench or "
            "sac-edge run, or the ROS 2 node's summary; its latency becomes a delay distribution in control steps "
            "at the env's period, drawn per episode (as --action-delay)",
            "metavar": "FILE",
        },
    )
    gamma: float = field(default=0.99, metadata={"help": "discount factor"})
    tau: float = field(default=0.005, metadata={"help": "soft target update rate"})
    actor_lr: float = field(default=3e-4, metadata={"help": "actor learning rate"})
    critic_lr: float = field(default=3e-4, metadata={"help": "critic learning rate"})
    alpha_lr: float = field(default=3e-4, metadata={"help": "entropy temperature learning rate"})
    init_alpha: float = field(default=1.0, metadata={"help": "initial entropy temperature"})
    autotune: bool = field(default=True, metadata={"help": "learn alpha towards target entropy -act_dim"})
    utd: int = field(default=1, metadata={"help": "updates per environment step (per env)"})
    normalize_obs: bool = field(default=True, metadata={"help": "running mean/var observation normalisation"})
    eval_every: int = field(default=5_000, metadata={"help": "steps between deterministic evaluations (0: off)"})
    eval_episodes: int = field(default=5, metadata={"help": "episodes per evaluation"})
    checkpoint_every: int = field(default=10_000, metadata={"help": "steps between checkpoints (0: only at end)"})
    calib_states: int = field(default=4096, metadata={"help": "observations saved to calib_states.npy"})
    threads: int = field(
        default=0,
        metadata={
            "help": "torch intra-op threads; 0 (auto): the fewest that run the update about as fast as any, "
            "timed at start on the CPUs this process may use, and stepped down if updates/s collapses beside "
            "busy neighbours (BENCHMARKS.md, 'Training: threads beside busy neighbours')"
        },
    )
    out: str = field(default="runs/latest", metadata={"help": "run directory"})
    resume: bool = field(
        default=False,
        metadata={
            "help": "continue the run in --out from its checkpoint with its saved settings; taken from the command "
            f"line: {', '.join(map(flag_of, RESUME_TAKES))} (any other setting given "
            "must be the saved one)"
        },
    )
    force: bool = field(default=False, metadata={"help": "overwrite an existing run in --out"})
    progress: bool = field(default=True, metadata={"help": "tqdm progress bar on stderr (on a terminal)"})
    json: bool = field(default=False, metadata={"help": "print a one-line JSON summary last on stdout"})
    # What a run reports about its own speed, memory and cost (train/monitor.py, profiling.py, cost.py).
    log_every: int = field(
        default=1000,
        metadata={
            "help": "env steps between metrics.csv / TensorBoard rows, each with its interval's rates, ms per "
            "update, memory and utilisation (0: rows only at evaluations and the end)"
        },
    )
    profile: int = field(
        default=0,
        metadata={
            "help": "profile N updates after a warm-up (bare --profile: 200) under torch.profiler: prints where "
            "an update's time goes by op category, writes RUN/profile/ (Perfetto / TensorBoard trace), then "
            "stops the run (continue it with --resume); 0: off",
            "const": 200,
        },
    )
    price_per_hour: float = field(
        default=0.0, metadata={"help": "the machine's price in $/h: the summary adds $ per run and per million steps"}
    )

    @property
    def critic_hidden(self) -> tuple[int, ...]:
        return (self.hidden[-1],) * self.critic_layers


#: Settings that must be positive, and those that must be in (0, 1] (a discount, a soft update rate).
POSITIVE = ("actor_lr", "critic_lr", "alpha_lr", "init_alpha")
FRACTIONS = ("gamma", "tau")
#: Counts that must be at least 1, and those that may also be 0 (off, or all).
AT_LEAST_ONE = ("total_steps", "num_envs", "batch_size", "buffer_size", "critic_layers", "utd", "eval_episodes")
NOT_NEGATIVE: tuple[str, ...] = ("seed", "learning_starts", "eval_every", "checkpoint_every", "calib_states", "threads")
NOT_NEGATIVE += ("log_every", "profile", "obs_history")
#: Upper bounds on sizes that are allocated or started up front: past them a run failed after minutes (an
#: allocation of the replay buffer or a batch), never started (100000 envs, 100000 critic layers) or crashed
#: (100000 torch threads); they are far above what a run needs. ``threads``: the CPUs this process may use.
AT_MOST = {
    "buffer_size": 10**8,
    "batch_size": 1 << 20,
    "num_envs": 1024,
    "critic_layers": 64,
    "utd": 1000,
    "eval_episodes": 10**5,
    "calib_states": 10**7,
    "obs_history": 64,  # common/obs_history.MAX_STEPS: each frame of history widens the input by a frame
    "seed": 2**63 - 1,  # torch's and numpy's seeds are 64-bit; a larger one was an OverflowError, exit 1
}


def value_error(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``name`` (None when it can): checked on the command line and on
    every value of a sweep's grid before any trial starts. NaN fails every range test here."""
    if name in POSITIVE and not (isinstance(value, (int, float)) and value > 0):
        return f"must be a positive number, got {value}"
    if name in FRACTIONS and not (isinstance(value, (int, float)) and 0 < value <= 1):
        return f"must be in (0, 1], got {value}"
    if name in AT_LEAST_ONE and not (isinstance(value, int) and value >= 1):
        return f"must be at least 1, got {value}"
    if name in NOT_NEGATIVE and not (isinstance(value, int) and value >= 0):
        return f"must be 0 or more, got {value}"
    if name == "price_per_hour" and not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
        return f"must be a price of 0 or more, got {value}"
    most = usable_cpus() if name == "threads" else AT_MOST.get(name)
    if most is not None and value > most:
        return f"must be at most {most}{' (the CPUs this process may use)' if name == 'threads' else ''}, got {value}"
    return None


def check_values(cfg: TrainConfig) -> None:
    """One-line ``SacEdgeError`` for the first setting of ``cfg`` ``value_error`` refuses."""
    for name in (*POSITIVE, *FRACTIONS, *AT_LEAST_ONE, *NOT_NEGATIVE, "price_per_hour"):
        problem = value_error(name, getattr(cfg, name))
        if problem:
            raise SacEdgeError(f"--{name.replace('_', '-')} {problem}")
    if cfg.action_delay and cfg.delay_profile:
        raise SacEdgeError("--action-delay and --delay-profile both set the delay: pass one")
    if cfg.action_delay:
        from sac_edge.common.delay import parse_action_delay

        parse_action_delay(cfg.action_delay)
    if cfg.grad_checkpoint and cfg.critic_layers < 2:  # the first layer is never checkpointed
        raise SacEdgeError("--grad-checkpoint has no layer to checkpoint with --critic-layers 1: drop it")
