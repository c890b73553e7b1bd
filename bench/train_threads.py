"""Training updates/s beside busy neighbours: ``sac-train``'s default ``--threads 0`` (auto) against each
forced thread count and Stable-Baselines3 SAC, quiet, beside one busy process, and beside one busy process
per usable CPU, all in one run.

Every measurement is a whole process, as a user runs it: ``sac-train`` (no flags but the run's length,
``--threads N`` for the forced rows; updates/s is its own ``--json`` value, the time inside its updates)
and SB3 SAC ``learn`` with the same env, batch, learning_starts and seed (its ``train`` calls timed; torch's
default threads, as SB3 runs). The neighbours are pure-Python busy loops, each in its own process, started
before the state's runs and killed at its end (and on any exit of this script). Within a state the
processes run one after another in the order given, ``--repeats`` times interleaved; medians reported.
The load average before each state is printed beside it: on a shared machine "quiet" is only as quiet as
the neighbours one does not control.

    python bench/train_threads.py                       # Pendulum-v1, 1000 updates a process, 3 states
    python bench/train_threads.py --env HalfCheetah-v5 --updates 2000 --repeats 3
    python bench/train_threads.py --states quiet --no-sb3

Prints a table, then one JSON line: per state the default's updates/s against the best forced count
(the goal: within 1.5x, ``default_vs_best`` >= 0.67) and against SB3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sac_edge.common.table import format_table
from sac_edge.train.threads import candidate_counts, usable_cpus

HERE = Path(__file__).resolve().parent
#: A pure-Python busy loop that also ends when this script is gone (it checks its parent now and then).
BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    for _ in range(10**6): pass"
#: The goal: the default within this factor of the best forced count in every state.
GOAL = 1.5


@contextmanager
def busy_neighbours(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` pure-Python busy loops, each its own process, killed when the block ends."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(count):
            procs.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP]))
        time.sleep(0.5 if count else 0.0)  # let the scheduler spread them before the runs start
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def capped(cmd: list[str], cap_s: float | None) -> subprocess.CompletedProcess[str] | None:
    """``cmd`` run to its end, or None when it ran past ``cap_s`` seconds (then killed)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=cap_s)
    except subprocess.TimeoutExpired:
        return None


def timed_out(updates: int, cap_s: float) -> dict[str, Any]:
    """A process killed at the cap: ``updates / cap_s`` stands in for its rate, marked "<" (its true bound is
    ``updates / (cap_s - start-up)``, a little higher: start-up is a few seconds of a cap of minutes)."""
    return {"updates_per_s": updates / cap_s, "capped": True, "threads": None, "log": [], "probe_s": None}


def sac_train(
    env_id: str, steps: int, learning_starts: int, threads: int | None, workdir: Path, cap_s: float | None
) -> dict[str, Any]:
    """One ``sac-train`` process: its updates/s, and (auto) the thread choices it logged and saved."""
    run = workdir / f"run-{threads}"
    cmd = [sys.executable, "-m", "sac_edge.train.cli", "--env", env_id, "--total-steps", str(steps),
           "--learning-starts", str(learning_starts), "--eval-every", "0", "--checkpoint-every", "0",
           "--no-progress", "--json", "--out", str(run), "--force"]  # fmt: skip
    if threads is not None:
        cmd += ["--threads", str(threads)]
    done = capped(cmd, cap_s)
    if done is None:
        assert cap_s is not None
        return timed_out(steps - learning_starts, cap_s)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    record = json.loads((run / "config.json").read_text())["choices"]["threads"]
    logged = [line.split(": ", 1)[-1] for line in done.stderr.splitlines() if "--threads auto" in line]
    return {"updates_per_s": summary["updates_per_s"], "threads": record["threads"], "log": logged,
            "probe_s": record.get("probe_s"), "capped": False}  # fmt: skip


def sb3(env_id: str, steps: int, learning_starts: int, seed: int, cap_s: float | None) -> dict[str, Any]:
    """One SB3 ``learn`` process (``bench/default_speed.py``'s child): updates/s inside its ``train`` calls."""
    cmd = [sys.executable, str(HERE / "default_speed.py"), "--sb3-child", env_id, str(steps), str(seed),
           str(learning_starts)]  # fmt: skip
    done = capped(cmd, cap_s)
    if done is None:
        assert cap_s is not None
        return timed_out(steps - learning_starts, cap_s)
    timed = json.loads(done.stdout.strip().splitlines()[-1])
    return {"updates_per_s": timed["updates"] / timed["update_s"], "capped": False}


def run_state(args: argparse.Namespace, busy: int, counts: list[int], workdir: Path) -> dict[str, Any]:
    """All impls in one state, ``--repeats`` interleaved rounds: medians and the auto runs' choices."""
    steps = args.learning_starts + args.updates
    impls: dict[str, Any] = {"default (auto)": None, **{f"--threads {n}": n for n in counts}}
    if not args.no_sb3:
        impls["SB3"] = "sb3"
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in impls}
    load_before = os.getloadavg()[0]
    with busy_neighbours(busy):
        for _ in range(args.repeats):
            for name, threads in impls.items():
                if threads == "sb3":
                    samples[name].append(sb3(args.env, steps, args.learning_starts, args.seed, args.cap_s))
                else:
                    samples[name].append(sac_train(args.env, steps, args.learning_starts, threads, workdir, args.cap_s))
                print(f"  busy={busy} {name}: {samples[name][-1]['updates_per_s']:.1f} updates/s", file=sys.stderr)
    rates = {name: statistics.median(s["updates_per_s"] for s in runs) for name, runs in samples.items()}
    capped_impls = sorted(name for name, runs in samples.items() if any(s["capped"] for s in runs))
    best = max(rates[f"--threads {n}"] for n in counts)
    default = rates["default (auto)"]
    auto_runs = samples["default (auto)"]
    return {
        "busy": busy,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "updates_per_s": {name: round(r, 1) for name, r in rates.items()},
        "capped": capped_impls,  # killed at --cap-s: their rate is an upper bound
        "default_threads": [s["threads"] for s in auto_runs if s["threads"] is not None],
        "default_log": auto_runs[0]["log"],
        "default_probe_s": [s["probe_s"] for s in auto_runs],
        "default_vs_best": round(default / best, 2),
        "default_vs_sb3": round(default / rates["SB3"], 2) if "SB3" in rates else None,
        "met": default * GOAL >= best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--updates", type=int, default=1000, help="updates a process (after learning_starts)")
    parser.add_argument("--learning-starts", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds per state; medians reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--forced", default="", help="forced counts (default: 1, 2, 4, ... up to the usable CPUs)")
    parser.add_argument("--states", default="quiet,one,all", help="quiet, one (busy process), all (one per CPU)")
    parser.add_argument("--no-sb3", action="store_true", help="skip the Stable-Baselines3 rows")
    parser.add_argument(
        "--cap-s",
        type=float,
        default=None,
        help="kill a process after this many seconds and report updates / cap as its (upper-bound) rate",
    )
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still runs the neighbours' cleanup

    cpus = usable_cpus()
    counts = [int(n) for n in args.forced.split(",")] if args.forced else candidate_counts(cpus.n)
    busy_of = {"quiet": 0, "one": 1, "all": cpus.n}
    states = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.states.split(","):
            states.append({"state": name, **run_state(args, busy_of[name], counts, Path(tmp))})

    rows = []
    for s in states:
        best = max(s["updates_per_s"][f"--threads {n}"] for n in counts)
        for impl, rate in s["updates_per_s"].items():
            sb3_rate = s["updates_per_s"].get("SB3")
            threads = ",".join(map(str, s["default_threads"])) if impl.startswith("default") else ""
            shown = f"< {rate}" if impl in s["capped"] else rate
            rows.append([f"{s['state']} ({s['busy']} busy, load {s['load_before']:.1f})", impl, threads, shown,
                         round(rate / best, 2), None if sb3_rate is None else round(rate / sb3_rate, 2)])  # fmt: skip
    print(f"{args.env}, {args.updates} updates a process, {cpus.n} usable CPUs ({cpus.source})")
    print(format_table(rows, ("state", "impl", "threads chosen", "updates/s", "x best forced", "x SB3")))
    for s in states:
        verdict = "met" if s["met"] else "NOT met"
        print(f"  {s['state']}: default {s['default_vs_best']}x the best forced count ({verdict}: within {GOAL}x)")
        for line in s["default_log"]:
            print(f"    {line}")
    met = all(s["met"] for s in states)
    head = {"bench": "train_threads", "env": args.env, "updates": args.updates, "repeats": args.repeats}
    print(json.dumps({**head, "usable_cpus": cpus.n, "goal": GOAL, "all_met": met, "states": states}))


if __name__ == "__main__":
    main()
