"""NVIDIA's real TensorRT modules in ``make test``: ``real_tensorrt_checks.py`` run in a subprocess that
imports the real 10.3 (JetPack 6's release) and 11.4 bindings over stub libraries built here with the C
compiler, and 10.3 once more with no TensorRT libraries at all.

The wheels (about 1.2 MB each, and cuda-python 12.2's 20 MB) are downloaded once into ``.cache/`` (ignored);
where there is no C compiler or no download, the test skips and says which.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CHECKS = Path(__file__).with_name("real_tensorrt_checks.py")
sys.path.insert(0, str(ROOT / "scripts"))
from real_tensorrt import CURRENT_11, NEAREST_JETPACK6, Unavailable, environment  # noqa: E402


@pytest.mark.parametrize(
    ("release", "libraries"), [(NEAREST_JETPACK6, True), (CURRENT_11, True), (NEAREST_JETPACK6, False)]
)
def test_the_product_on_the_real_module(pendulum_bundle: Path, release: str, libraries: bool) -> None:
    try:
        env = environment(release, libraries=libraries, with_cuda_python=libraries)
    except Unavailable as err:
        pytest.skip(f"the real TensorRT {release} cannot be had here: {err}")
    env.update(
        SAC_EDGE_REAL_TRT=release,
        SAC_EDGE_REAL_TRT_LIBS="1" if libraries else "0",
        SAC_EDGE_TEST_BUNDLES=str(pendulum_bundle.parent),  # the session's bundle, not a rebuilt one
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(CHECKS)]
    result = subprocess.run(cmd, cwd=ROOT / "tests", env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    expected = 9 if libraries else 2
    assert f"{expected} passed" in result.stdout, result.stdout[-3000:]
    assert os.environ.get("SAC_EDGE_REAL_TRT") is None  # the real module never leaks into this session
