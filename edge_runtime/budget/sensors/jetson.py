"""What kind of Jetson a root file system is: board model, L4T release, JetPack, nvpmodel mode.

Each reader takes ``root: Path`` and reads the files where a Jetson keeps them (jetson-stats
jtop/core/jetson_variables.py reads the same): the model from ``sys/firmware/devicetree/base/model``
(``/proc/device-tree`` is a link to that folder on the device), the L4T release from the first line of
``etc/nv_tegra_release``, the power mode from ``var/lib/nvpmodel/status`` and, where that file is absent
(nvpmodel has not run since the image was flashed), the default of ``etc/nvpmodel.conf``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .base import SensorError, read_sensor_text

_TEGRA_RELEASE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")
_PMODE = re.compile(r"pmode:(\d+)")
_CONF_MODE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>")
_CONF_DEFAULT = re.compile(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>")

# L4T -> JetPack, JetPack 4.2 to 6.2 (NVIDIA's JetPack archive and each L4T release's notes; the same pairs as
# jetson-stats' NVIDIA_JETPACK, which the tests check). Several L4T point releases share one JetPack.
JETPACK = {
    "32.1.0": "4.2",
    "32.2.0": "4.2.1",
    "32.2.1": "4.2.2",
    "32.2.3": "4.2.3",
    "32.3.1": "4.3",
    "32.4.2": "4.4 DP",
    "32.4.3": "4.4",
    "32.4.4": "4.4.1",
    "32.5.0": "4.5",
    "32.5.1": "4.5.1",
    "32.5.2": "4.5.1",
    "32.6.1": "4.6",
    "32.7.1": "4.6.1",
    "32.7.2": "4.6.2",
    "32.7.3": "4.6.3",
    "32.7.4": "4.6.4",
    "32.7.5": "4.6.5",
    "32.7.6": "4.6.6",
    "34.0.1": "5.0 PRE-DP",
    "34.1.0": "5.0 DP",
    "34.1.1": "5.0.1 DP",
    "35.1.0": "5.0.2",
    "35.2.1": "5.1",
    "35.3.0": "5.1.1 PRE",
    "35.3.1": "5.1.1",
    "35.4.1": "5.1.2",
    "35.5.0": "5.1.3",
    "35.6.0": "5.1.4",
    "35.6.1": "5.1.5",
    "35.6.2": "5.1.5",
    "35.6.3": "5.1.5",
    "35.6.4": "5.1.6",
    "35.6.5": "5.1.7",
    "36.0.0": "6.0 EA",
    "36.2.0": "6.0 DP",
    "36.3.0": "6.0",
    "36.4.0": "6.1",
    "36.4.2": "6.1 (rev1)",
    "36.4.3": "6.2",
    "36.4.4": "6.2.1",
    "36.4.7": "6.2.1",
    "36.5.0": "6.2.2",
    "36.5.2": "6.2.3",
}


def _text(path: Path) -> str:
    """The file's text, bounded and from a regular file only (``read_sensor_text``), "" when it cannot be read."""
    try:
        return read_sensor_text(path).replace("\x00", "").strip()
    except SensorError:
        return ""


def board_model(root: Path) -> str:
    """The device tree's model string (``NVIDIA Jetson Orin Nano Developer Kit``), "" off a device tree."""
    for path in ("sys/firmware/devicetree/base/model", "proc/device-tree/model"):
        model = _text(root / path)
        if model:
            return model
    return ""


def l4t_release(root: Path) -> str | None:
    """``35.2.1`` from ``root/etc/nv_tegra_release`` (``# R35 (release), REVISION: 2.1, ...``), None off Jetson."""
    match = _TEGRA_RELEASE.search(_text(root / "etc/nv_tegra_release").split("\n")[0])
    if not match:
        return None
    revision = match.group(2) if match.group(2).count(".") else match.group(2) + ".0"
    return f"{match.group(1)}.{revision}"


def jetpack(release: str) -> str | None:
    """The JetPack that ships L4T ``release``; None for one the table does not know."""
    return JETPACK.get(release)


def is_jetson(root: Path) -> bool:
    """An L4T release file or an NVIDIA Jetson device-tree model."""
    return l4t_release(root) is not None or "jetson" in board_model(root).lower()


@dataclass(frozen=True)
class PowerMode:
    """An nvpmodel mode: its id, its name from the conf ("" when unknown), and whether nvpmodel's status file
    said so (``from_status``) or it is the conf's default (no status file yet)."""

    id: int
    name: str
    from_status: bool

    def describe(self) -> str:
        label = f"{self.id} {self.name}".strip()
        return label if self.from_status else f"{label} (the conf's default; no var/lib/nvpmodel/status)"


def nvpmodel_modes(root: Path) -> tuple[dict[int, str], int | None]:
    """``{id: name}`` and the default id from ``root/etc/nvpmodel.conf``."""
    text = _text(root / "etc/nvpmodel.conf")
    default = _CONF_DEFAULT.search(text)
    return {int(i): name for i, name in _CONF_MODE.findall(text)}, int(default.group(1)) if default else None


def power_mode(root: Path) -> PowerMode | None:
    """The current nvpmodel mode, else the conf's default, else None."""
    names, default = nvpmodel_modes(root)
    match = _PMODE.search(_text(root / "var/lib/nvpmodel/status"))
    if match:
        mode = int(match.group(1))
        return PowerMode(mode, names.get(mode, ""), True)
    if default is not None:
        return PowerMode(default, names.get(default, ""), False)
    return None


def nvpmodel_mode(root: Path) -> int | None:
    """The mode id of :func:`power_mode`, None when neither the status file nor the conf says."""
    mode = power_mode(root)
    return mode.id if mode else None
