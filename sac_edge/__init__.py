"""sac-edge: train SAC policies on a server, deploy and fine-tune them on NVIDIA Jetson.

The pipeline stages live in top-level folders and import as ``sac_edge.<stage>``. Installed, setuptools
maps each name to its folder (pyproject's ``package-dir``); in the source tree each ``sac_edge/<stage>``
is a symlink to ``../<stage>``, so mypy, pyright and editors resolve every ``sac_edge.*`` import to its
file without running the editable-install hook (``tests/test_typecheck.py`` keeps both true).
"""

__version__ = "0.1.0"
