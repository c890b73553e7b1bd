"""Config sections in ``common/config.py``: a section's fields are flags under their own names (grouped in
``--help`` and docs/CLI.md), the saved config nests them, and ``check_fields`` holds a config built in Python
to what the parser would accept."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest

from sac_edge.common.config import (
    build_parser,
    check_fields,
    config_dict,
    config_from_dict,
    config_from_flags,
    options,
    parse_config,
    reference_markdown,
)
from sac_edge.common.errors import InternalError, SacEdgeError


@dataclass(frozen=True)
class Engine:
    """How the engine runs.

    (Only the first paragraph is the group's description.)"""

    kind: str = field(default="fast", metadata={"flag": "--engine", "help": "engine", "choices": ["fast", "slow"]})
    limit: float | None = field(default=None, metadata={"help": "the limit"})
    cores: tuple[int, ...] = field(default=(), metadata={"help": "the cores"})


@dataclass(frozen=True)
class Command:
    """A command with one section."""

    target: str = field(metadata={"help": "what to run"})
    loud: bool = field(default=False, metadata={"help": "say more"})
    engine: Engine = field(default_factory=Engine)


@dataclass(frozen=True)
class Clash:
    engine: Engine = field(default_factory=Engine)
    kind: str = field(default="x", metadata={"flag": "--engine"})


def test_a_section_s_fields_are_flags_under_their_own_group() -> None:
    parser = build_parser(Command, "cmd", "x", positional=("target",))
    help_text = parser.format_help()
    assert "engine:\n  How the engine runs.\n" in help_text and "first paragraph" not in help_text
    group = help_text[help_text.index("\nengine:\n") :]
    assert "--engine {fast,slow}" in group and "--cores" in group and "--loud" not in group
    cfg = parse_config(Command, ["t", "--engine", "slow", "--cores", "2,3", "--loud"], "cmd", "x", ("target",))
    assert cfg == Command("t", True, Engine("slow", None, (2, 3)))
    assert "engine (default: fast)" in group and "the limit\n" in group and "the cores\n" in group  # no None, ()
    markdown = reference_markdown(Command, ("target",))
    assert "**engine**: How the engine runs.\n\n| argument |" in markdown and "| `--engine STR` | `fast` |" in markdown


def test_the_saved_config_nests_sections_and_reads_back() -> None:
    cfg = Command("t", engine=Engine("slow", 1.5, (1,)))
    saved = config_dict(cfg)
    assert saved == {"target": "t", "loud": False, "engine": {"kind": "slow", "limit": 1.5, "cores": [1]}}
    assert config_from_dict(Command, saved, "saved.json") == cfg
    with pytest.raises(SacEdgeError, match=r"saved.json: unknown setting\(s\) speed"):
        config_from_dict(Command, {**saved, "engine": {**saved["engine"], "speed": 1}}, "saved.json")


def test_settings_named_as_flags_go_to_their_sections() -> None:
    assert config_from_flags(Command, {"target": "t", "engine": "slow", "limit": 2}, "here") == Command(
        "t", engine=Engine("slow", 2)
    )
    with pytest.raises(SacEdgeError, match=r"^here: kind is no setting of Command"):  # the field's name is no flag
        config_from_flags(Command, {"target": "t", "kind": "slow"}, "here")
    with pytest.raises(SacEdgeError, match="--limit must be a finite number"):
        config_from_flags(Command, {"target": "t", "limit": float("nan")}, "here")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (Engine(kind="warp"), "--engine must be one of fast, slow, got 'warp'"),
        (Engine(limit="1"), "--limit must be a number, got '1'"),  # type: ignore[arg-type]
        (Engine(limit=True), "--limit must be a number, got True"),  # type: ignore[arg-type]
        (Engine(limit=float("inf")), "--limit must be a finite number"),
        (Engine(cores=[1]), "--cores must be a tuple of int values, got [1]"),  # type: ignore[arg-type]
        (Engine(cores=(1.5,)), "--cores must be a tuple of int values"),  # type: ignore[arg-type]
        (Command(target=3), "--target must be a string, got 3"),  # type: ignore[arg-type]
        (Command("t", loud=1), "--loud must be true or false, got 1"),  # type: ignore[arg-type]
        (Command("t", engine={"kind": "fast"}), "Command.engine must be a Engine"),  # type: ignore[arg-type]
    ],
)
def test_check_fields_refuses_what_the_parser_would(config: object, message: str) -> None:
    with pytest.raises(SacEdgeError, match="^" + re.escape(message)):
        check_fields(config)


def test_check_fields_takes_what_the_parser_makes() -> None:
    check_fields(Engine(limit=2))  # an int where a float is wanted, as 2 on the command line
    check_fields(Engine(limit=None, cores=(0, 1)))
    check_fields(Command("t"))


@dataclass(frozen=True)
class Switched:
    """An engine behind a switch.

    (The switch and the engine's settings share this group and this object in the saved config.)"""

    engine: Engine = field(default_factory=Engine, metadata={"inline": True})
    switch: str = field(default="on", metadata={"flag": "--switch", "help": "the switch", "choices": ["on", "off"]})


@dataclass(frozen=True)
class Spare:
    size: int = field(default=1, metadata={"help": "the spare's size"})


@dataclass(frozen=True)
class SwitchedCommand:
    target: str = field(metadata={"help": "what to run"})
    switched: Switched = field(default_factory=Switched)
    spare: Spare | None = field(default_factory=Spare)


def test_an_inline_section_s_settings_share_the_outer_group_and_object() -> None:
    """A switch beside the options it switches: one group in ``--help``, one object in the saved config,
    which reads back."""
    help_text = build_parser(SwitchedCommand, "cmd", "x", ("target",)).format_help()
    group = help_text[help_text.index("\nswitched:\n") :]
    assert "An engine behind a switch." in group and "--engine {fast,slow}" in group and "--switch {on,off}" in group
    assert "\nengine:" not in help_text
    cfg = parse_config(SwitchedCommand, ["t", "--engine", "slow", "--switch", "off"], "cmd", "x", ("target",))
    assert cfg == SwitchedCommand("t", Switched(Engine("slow"), "off"))
    saved = config_dict(cfg)
    assert saved == {
        "target": "t",
        "switched": {"kind": "slow", "limit": None, "cores": [], "switch": "off"},
        "spare": {"size": 1},
    }
    assert config_from_dict(SwitchedCommand, saved, "saved.json") == cfg
    without = SwitchedCommand("t", spare=None)
    assert (
        config_dict(without)["spare"] is None
        and config_from_dict(SwitchedCommand, config_dict(without), "s") == without
    )
    with pytest.raises(SacEdgeError, match=r"saved.json: unknown setting\(s\) speed"):
        config_from_dict(SwitchedCommand, {**saved, "switched": {**saved["switched"], "speed": 1}}, "saved.json")


def test_an_optional_section_may_be_none_and_is_checked_when_given() -> None:
    check_fields(SwitchedCommand("t", spare=None))
    check_fields(SwitchedCommand("t", spare=Spare()))
    with pytest.raises(
        SacEdgeError, match=r"^SwitchedCommand.spare must be a Spare, got 3; pass Spare\(...\) or None$"
    ):
        check_fields(SwitchedCommand("t", spare=3))  # type: ignore[arg-type]


def test_two_settings_with_one_flag_are_a_bug() -> None:
    with pytest.raises(InternalError, match=r"kind and engine\.kind share --engine"):
        options(Clash)


@pytest.mark.parametrize(
    ("text", "value"), [("-1e9", -1e9), ("-5", -5.0), ("-.5", -0.5), ("-2.5E-3", -2.5e-3), ("-7.", -7.0)]
)
def test_a_negative_number_after_a_flag_is_its_value(text: str, value: float) -> None:
    """argparse's own pattern knows only ``-5`` and ``-.5``: ``--limit -1e9`` was "expected one argument"."""
    cfg = parse_config(Command, ["t", "--limit", text, "--cores", "-1,2"], "cmd", "x", ("target",))
    assert cfg.engine.limit == value and cfg.engine.cores == (-1, 2)


def test_a_negative_infinity_is_read_as_a_value_and_refused_as_one() -> None:
    with pytest.raises(SacEdgeError, match=r"^--limit must be a finite number, got -inf"):
        parse_config(Command, ["t", "--limit", "-inf"], "cmd", "x", ("target",))
    with pytest.raises(SacEdgeError, match=r"^argument --limit: expected one argument"):  # a word stays a flag
        parse_config(Command, ["t", "--limit", "-fast"], "cmd", "x", ("target",))


@pytest.mark.parametrize("argv", [["sac-train"], ["sac-export"], ["sac-sweep"], ["sac-edge"], ["sac-edge", "run"]])
def test_every_command_prints_its_version(argv: list[str]) -> None:
    """The installed console scripts: ``--version`` is the command and sac-edge's one version, exit 0."""
    import subprocess
    import sys
    from pathlib import Path

    from sac_edge import __version__

    done = subprocess.run(
        [str(Path(sys.executable).parent / argv[0]), *argv[1:], "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{' '.join(argv)} {__version__}\n", "")


def test_the_installed_version_is_the_packages() -> None:
    """pyproject takes its version from ``sac_edge.__version__``: pip's record and --version agree."""
    import importlib.metadata

    from sac_edge import __version__

    assert importlib.metadata.version("sac-edge") == __version__
