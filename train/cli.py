"""``sac-train``: train a SAC policy and write a run dir (docs/CONTRACTS.md, "Run dir")."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from sac_edge.common.config import parse_config
from sac_edge.common.errors import require_extra, run_cli
from sac_edge.common.summary import emit_json

from .config import TrainConfig, check_values

PROG = "sac-train"
NEEDS = ("torch", "tqdm")
"""What training imports beyond the device install: pyproject's ``train`` extra."""


def _main(argv: Sequence[str] | None) -> int:
    cfg = parse_config(TrainConfig, argv, PROG, __doc__ or "")
    check_values(cfg)  # before torch loads
    require_extra(PROG, "train", NEEDS)
    from .stopping import Stopped
    from .trainer import Trainer  # torch and gymnasium load after the flags parse (fast --help)

    try:
        summary = Trainer(cfg).train()
    except Stopped as stop:  # SIGINT or SIGTERM, at a step boundary, after saving
        print(
            f"{PROG}: {stop}; its checkpoint is saved in {stop.run}; continue with: {PROG} --out {stop.run} "
            f"--resume --total-steps {stop.total}",
            file=sys.stderr,
        )
        return stop.exit_code
    ret = "n/a" if summary.final_eval_return is None else f"{summary.final_eval_return:.1f}"
    print(
        f"{PROG}: {summary.steps} steps, {summary.updates} updates ({summary.updates_per_s:.0f} updates/s), "
        f"{summary.episodes} episodes, final eval return {ret}, run dir {summary.run}",
        file=sys.stderr if cfg.json else sys.stdout,
    )
    if cfg.json:
        emit_json(summary._asdict())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(PROG, _main, argv)


if __name__ == "__main__":
    sys.exit(main())
