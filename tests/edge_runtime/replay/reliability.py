"""How reliable ``sac-edge replay``'s diagnosis is over seeds and recording lengths (BENCHMARKS.md's table).

``python tests/edge_runtime/replay/reliability.py OUT_DIR [SEEDS] [LENGTHS] [NOISE]`` records HalfCheetah with each
fault (recordings.py; the fault's onset scaled to the length) for every seed x length, replays each, and
prints one Markdown row per fault and length: how many seeds were named exactly right (the fault's kind
on its joints, nothing else), named with extra findings, or missed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from recordings import FAULTS, NOISE, Faults, halfcheetah_bundle, record

from sac_edge.edge_runtime.config import ReplayConfig
from sac_edge.edge_runtime.replayer import replay_command


def scaled(name: str, faults: Faults, steps: int) -> Faults:
    """The fault with its onset at the same fraction of a ``steps``-long recording as in the tests (of 1000)."""
    if faults.frozen:
        return Faults(frozen=(faults.frozen[0], faults.frozen[1], faults.frozen[2] * steps // 1000))
    if faults.gap:
        return Faults(gap=(faults.gap[0] * steps // 1000, faults.gap[1]))
    return faults


def main() -> None:
    out = Path(sys.argv[1])
    seeds = range(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    lengths = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "150,300,600,1000,2000").split(",")]
    noise = float(sys.argv[4]) if len(sys.argv) > 4 else NOISE
    bundle = out / "bundle"
    if not bundle.exists():
        halfcheetah_bundle(bundle)
    cases = {"clean": (Faults(), ("agree", None)), **FAULTS}
    print("| recording | " + " | ".join(f"{n} steps" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for name, (faults, (kind, joints)) in cases.items():
        cells = []
        for steps in lengths:
            exact = extra = missed = 0
            for seed in seeds:
                path = out / f"{name}-{steps}-{seed}.mcap"
                record(bundle, path, steps, seed, scaled(name, faults, steps), noise)
                report = replay_command(ReplayConfig(str(bundle), str(path)), lambda _: None)
                named = [(f["kind"], set(f["joints"])) for f in report["findings"]]
                right = [n for n in named if n[0] == kind and (joints is None or n[1] == joints)]
                if name == "clean":
                    exact, extra = exact + (not named), extra + bool(named)
                elif right and len(named) == 1:
                    exact += 1
                elif right:
                    extra += 1
                else:
                    missed += 1
                path.unlink()
            cells.append(f"{exact}/{len(seeds)}" + (f" (+{extra} extra)" if extra else "") + (
                f" ({missed} missed)" if missed else ""))  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
