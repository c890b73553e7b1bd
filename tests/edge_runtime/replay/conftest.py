"""The HalfCheetah bundle and its physics-driven recordings (recordings.py), made once per session. recordings
is imported in the fixtures: it builds bundles with torch, which the device install has not."""

from __future__ import annotations

from pathlib import Path

import pytest

STEPS = 1000


@pytest.fixture(scope="session")
def cheetah_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from recordings import halfcheetah_bundle

    return halfcheetah_bundle(tmp_path_factory.mktemp("replay") / "cheetah")


@pytest.fixture(scope="session")
def recordings(cheetah_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> MCAP file: ``clean`` and one per fault of ``FAULTS``, each ``STEPS`` env steps."""
    from recordings import FAULTS, Faults, record

    out = tmp_path_factory.mktemp("recordings")
    made = {}
    for name, faults in [("clean", Faults()), *((n, f) for n, (f, _) in FAULTS.items())]:
        made[name] = out / f"{name}.mcap"
        record(cheetah_bundle, made[name], STEPS, seed=0, faults=faults)
    return made
