"""Checks of a command's flags against the verified bundle, made before anything slow is opened (the env,
the fine-tuning lock, the backends, the learner process): one function per check, each raising one line
that names the problem and the fix (exit 2).

``checked_bundle`` runs them where the bundle is verified (``compose.verified_bundle``) and on a bundle a
``Runtime`` caller opened itself; ``drill.py`` calls the ones that apply to it. So a flag that does not fit
the bundle is refused in a second, not after an env was made or a learner process imported torch.
"""

from __future__ import annotations

from sac_edge.common.bundle import Bundle
from sac_edge.common.bundle_format import INT8, MANIFEST, PRECISIONS
from sac_edge.common.errors import SacEdgeError
from sac_edge.edge_runtime.control.shield import ShieldOptions

from .config import BenchConfig, RuntimeOptions

FINETUNE_FLOOR_MB = 350.0
"""The smallest ``--mem-budget-mb`` that fine-tuning can fit in: below the learner process's own resident
memory (torch after its warm-up update), before the control process, the replay buffer or any headroom.
Measured at 377 MiB (VmRSS of the learner child, with and without the int8 re-check, torch 2.13.0+cpu,
x86_64) by the command in docs/TESTING.md ("The fine-tuning memory floor"); rounded down so the floor
only refuses budgets the learner alone already exceeds. The sizing in ``finetune/sizing.py`` makes the
exact refusal once the learner is measured."""


def checked_bundle(bundle: Bundle, cfg: RuntimeOptions | BenchConfig) -> Bundle:
    """``bundle`` after every check that applies to ``cfg`` passed (one line, exit 2, on the first that fails)."""
    check_gate(bundle)
    if isinstance(cfg, BenchConfig):
        return bundle
    if cfg.shield is not None:
        check_action_sizes(cfg.shield, bundle.spec.act_dim)
    check_finetune_memory(cfg.finetune.enabled, cfg.budget.mem_budget_mb)
    return bundle


def check_action_sizes(shield: ShieldOptions, act_dim: int) -> None:
    """``--safe-action`` and ``--slew`` hold as many numbers as the bundle's actions (the shield's own
    check, which it makes again when it is built)."""
    problem = shield.problem(act_dim)
    if problem is not None:
        raise SacEdgeError(problem)


def check_finetune_memory(finetune: bool, mem_budget_mb: float | None) -> None:
    """``--mem-budget-mb`` is at least the fine-tuning floor when fine-tuning (``FINETUNE_FLOOR_MB``)."""
    if finetune and mem_budget_mb is not None and mem_budget_mb < FINETUNE_FLOOR_MB:
        raise SacEdgeError(
            f"--mem-budget-mb {mem_budget_mb:g} cannot hold fine-tuning: its learner process alone needs about "
            f"{FINETUNE_FLOOR_MB:g} MiB; raise --mem-budget-mb to at least {FINETUNE_FLOOR_MB:g} or drop --finetune"
        )


def check_gate(bundle: Bundle) -> None:
    """The manifest's accuracy-gate record has the form sac-export writes: null, one record (the int8 gate)
    or records keyed by precision. A damaged one would otherwise read as "no verdict" and hide the damage."""
    problem = gate_problem(bundle.manifest.get("gate"))
    if problem is not None:
        raise SacEdgeError(
            f"{bundle.path / MANIFEST}: the accuracy gate {problem}; re-export the bundle with sac-export"
        )


def gate_problem(gate: object) -> str | None:
    """What is wrong with a manifest's ``gate`` value, or None."""
    if gate is None:
        return None
    if not isinstance(gate, dict):
        return f"is {_shown(gate)}, not a record"
    records = {INT8: gate} if "verdict" in gate else gate
    for precision, record in records.items():
        if precision not in PRECISIONS:
            return f"names {_shown(precision)}, not one of {', '.join(PRECISIONS)}"
        if not isinstance(record, dict):
            return f"record for {precision} is {_shown(record)}, not a record"
        verdict = record.get("verdict")
        if verdict is not None and not isinstance(verdict, str):
            return f"verdict for {precision} is {_shown(verdict)}, not a word"
        layers = record.get("float_layers")
        if layers is not None and not (isinstance(layers, list) and all(isinstance(n, str) for n in layers)):
            return f"float_layers for {precision} is {_shown(layers)}, not a list of layer names"
    return None


def _shown(value: object) -> str:
    """A value of the wrong type, short enough for the one line."""
    return f"{type(value).__name__} {str(value)[:40]!r}"
