"""``python tests/script_help.py SCRIPT...``: each script's ``--help`` as ``python SCRIPT --help`` prints it, as
one JSON object {script: [exit status, stdout, stderr]}.

Each script runs in a child forked from this process after it imported the libraries the scripts share
(torch, numpy, onnxruntime, gymnasium): the import a fresh interpreter pays for each script (about 2 s of
torch alone) is paid once. A child starts as ``python SCRIPT`` does: ``sys.argv`` and ``sys.path[0]`` the
script's, ``__main__`` its code, its own stdout and stderr; the imports of the script itself run in it.
The repository root comes next on ``sys.path``: the scripts import this checkout's sac_edge, as in a clone
whose editable install points here (a worktree's scripts would otherwise import another checkout's).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

SHARED = ("numpy", "torch", "onnxruntime", "gymnasium")
ROOT = Path(__file__).resolve().parents[1]


def _child(script: str, out: int, err: int) -> None:
    """Run ``script --help`` in this (forked) process and exit with its status; never returns."""
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.argv = [script, "--help"]
    sys.path[0:1] = [str(Path(script).resolve().parent), str(ROOT)]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def help_of(script: str) -> tuple[int, str, str]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(script, out.fileno(), err.fileno())
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        out.seek(0)
        err.seek(0)
        return status, out.read().decode(errors="replace"), err.read().decode(errors="replace")


if __name__ == "__main__":
    for name in SHARED:
        importlib.import_module(name)
    print(json.dumps({script: help_of(script) for script in sys.argv[1:]}))
