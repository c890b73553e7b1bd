"""``sac-export``'s one frozen config. Field help texts become ``--help``; the resolved config is saved in the
bundle as ``export_config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINE_MODES = ("auto", "never", "always")
CALIB_METHODS = ("minmax", "percentile", "entropy")  # calibration.calibrators.METHODS (not imported: lazy)


@dataclass(frozen=True)
class ExportConfig:
    run: str = field(
        default="runs/latest", metadata={"help": "run dir written by sac-train, or a Stable-Baselines3 SAC .zip"}
    )
    out: str = field(default="bundles/latest", metadata={"help": "bundle directory to write"})
    env: str = field(
        default="",
        metadata={
            "help": "environment id, checked against the source's spaces; adds calibration rollouts and the return "
            "half of the INT8 gate (an SB3 .zip without it: spaces from the zip, action-error gate only)"
        },
    )
    vecnormalize: str = field(
        default="",
        metadata={"help": "an SB3 zip's VecNormalize statistics (.pkl, read without unpickling code), baked in"},
    )
    fp16: bool = field(default=True, metadata={"help": "build an FP16 TensorRT engine (or defer it to the device)"})
    int8: bool = field(
        default=False, metadata={"help": "calibrate, write policy.int8.onnx + calib.cache, run the gate"}
    )
    calib_samples: int = field(default=2048, metadata={"help": "calibration states (replay sample + fresh rollouts)"})
    calib_method: str = field(
        default="percentile",
        metadata={
            "help": "activation calibrator for every tensor (see --calib-overrides)",
            "choices": list(CALIB_METHODS),
        },
    )
    calib_overrides: tuple[str, ...] = field(
        default=(), metadata={"help": "per-tensor calibrators, TENSOR=METHOD (tensor names as in policy.onnx)"}
    )
    gate_episodes: int = field(default=5, metadata={"help": "seeded episodes per precision in the INT8 gate"})
    parity_states: int = field(default=10_000, metadata={"help": "held-out states for the ONNX vs PyTorch parity"})
    parity_tol: float = field(
        default=0.0,
        metadata={
            "help": "max abs action error (env units) the parity check allows; 0: derived from the network: twice "
            "the rigorous float32 error bound of its action on the parity states (layer widths, weights, inputs; "
            "export/parity.py)"
        },
    )
    envelope: bool = field(
        default=True,
        metadata={
            "help": "write envelope.json: per-dimension bounds and a Mahalanobis threshold from the training "
            "states (and rollouts when the env can be made) for the runtime's shield, with the slew default"
        },
    )
    envelope_margin: float = field(
        default=0.1,
        metadata={"help": "widen each dimension's 0.001..0.999 quantile range by this fraction on each side"},
    )
    envelope_fpr: float = field(
        default=0.001,
        metadata={"help": "false-positive rate the envelope's threshold is calibrated to on held-out training states"},
    )
    envelope_episodes: int = field(
        default=4, metadata={"help": "seeded rollouts of the exported policy added to the envelope's states (0: none)"}
    )
    layout: str | None = field(
        default=None,
        metadata={
            "help": "the robot's I/O layout (JSON or YAML; docs/CONTRACTS.md, Layout): joints and fields per "
            "observation slot, the action's joints and interface; checked against the policy and stored in the bundle"
        },
    )
    engine: str = field(
        default="auto",
        metadata={
            "help": "TensorRT engines: auto builds them when tensorrt and a GPU are present, always requires that",
            "choices": list(ENGINE_MODES),
        },
    )
    workspace_mb: int = field(default=512, metadata={"help": "TensorRT builder workspace limit (MiB)"})
    max_batch: int = field(default=64, metadata={"help": "largest batch of the TensorRT optimisation profile"})
    seed: int = field(default=0, metadata={"help": "seed for held-out states, calibration rollouts and the gate"})
    force: bool = field(
        default=False,
        metadata={"help": "replace an existing sac-export bundle in --out (only once complete; never its finetune/)"},
    )
    discard_finetuned: bool = field(
        default=False,
        metadata={"help": "with --force, also delete the fine-tuned weights in the old bundle's finetune/"},
    )
    sign_key: str | None = field(
        default=None,
        metadata={"help": "Ed25519 private key (sac-edge keygen) to sign the manifest with (manifest.sig)"},
    )
    json: bool = field(default=False, metadata={"help": "print a one-line JSON summary last on stdout"})
    verbose: bool = field(default=False, metadata={"help": "let library warnings through to stderr"})
