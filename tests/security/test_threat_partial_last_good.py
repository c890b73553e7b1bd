"""A fine-tuning directory's last good weights that do not fit the bundle: a set missing a tensor was served
mixed with the bundle's own weights (a swap installs only the names it is given), and a set carrying huge
shadow states cost gigabytes at ``--resume --precision int8`` (the int8 re-check ran on every state). Both are
refused in one line before the backends are swapped; the shadow states from the file's header alone."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from sac_edge.common.bundle_format import LEARNER
from sac_edge.edge_runtime import cli as edge_cli
from sac_edge.edge_runtime.finetune.promotion import LastGoodStore


@pytest.fixture
def ft_bundle(clean_finetune_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean_finetune_bundle, tmp_path / "bundle"))


def _resume(bundle: Path, precision: str = "fp32") -> list[str]:
    return ["run", str(bundle), "--resume", "--backend", "onnxruntime", "--precision", precision, "--duration", "0.2"]


def test_a_last_good_missing_a_tensor_is_refused_not_served_mixed(ft_bundle: Path, refused: Callable[..., str]) -> None:
    tensors = load_file(str(ft_bundle / LEARNER))
    tuned = {k: v * 0.5 for k, v in tensors.items() if k != "actor.mu.bias"}  # fine-tuned, one tensor lost
    LastGoodStore(ft_bundle / "finetune").save(tuned, np.zeros((4, 3), np.float32), {"generation": 3})
    err = refused(edge_cli.main, _resume(ft_bundle))
    assert "the last good weights lack actor.mu.bias, which the bundle's learner has" in err and "--restart" in err


def test_a_last_good_tensor_of_another_shape_is_refused(ft_bundle: Path, refused: Callable[..., str]) -> None:
    tensors = load_file(str(ft_bundle / LEARNER))
    tensors["critic.weights.1"] = np.zeros((2, 16, 16), np.float32)  # a critic of another width
    LastGoodStore(ft_bundle / "finetune").save(tensors, np.zeros((4, 3), np.float32), {"generation": 3})
    err = refused(edge_cli.main, _resume(ft_bundle))
    assert "critic.weights.1 of shape (2, 16, 16), the bundle's learner (2, 32, 32)" in err


@pytest.mark.parametrize(
    ("states", "message"), [((200_000, 3), "200000 shadow states, more than the 512"), ((4, 7), "not (n, 3)")]
)
def test_huge_or_misshapen_shadow_states_are_refused_before_the_int8_recheck(
    ft_bundle: Path, refused: Callable[..., str], states: tuple[int, int], message: str
) -> None:
    tensors = load_file(str(ft_bundle / LEARNER))
    LastGoodStore(ft_bundle / "finetune").save(tensors, np.ones(states, np.float32), {"generation": 3})
    assert message in refused(edge_cli.main, _resume(ft_bundle, "int8"))
