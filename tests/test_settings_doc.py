"""The settings' manual is made from the settings, and no other page states another default."""

from __future__ import annotations

import pathlib
import re

import pytest

from aserve.cli import _default_text, setting_flag, settings_table
from aserve.config import Setting, settings_fields

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# a flag in backquotes, then within the sentence "default" and what follows it
STATED = re.compile(r"`(--[a-z][a-z-]*)[^`]*`([^|\n.]{0,60}?)\bdefault\b[,:]?\s+(?:is\s+)?(`?)([^\s,;)`|]+)")
LITERAL = re.compile(r"[0-9][0-9.]*|on|off|none")


def _flags() -> dict[str, Setting]:
    return {flag: s for s in settings_fields() if (flag := setting_flag(s)) is not None}


def test_the_settings_page_is_the_output_of_aserve_settings() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    table = text[text.index("| flag |"):]
    assert table == settings_table(), "docs/settings.md is stale: put the output of `aserve settings` in its table"


def stated_defaults(text: str) -> list[tuple[str, str]]:
    """(flag, value) for each default a page states as a literal: a number, on, off, none,
    or a word in backquotes, right after `default` in the sentence that names the flag."""
    out = []
    for m in STATED.finditer(text):
        flag, quoted, value = m.group(1), m.group(3), m.group(4)
        if quoted or LITERAL.fullmatch(value):
            out.append((flag, value))
    return out


def agrees(setting: Setting, value: str) -> bool:
    default = setting.default
    return value in {_default_text(setting), str(default), f"{default:g}" if isinstance(default, float) else ""}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_page_states_only_the_defaults_the_code_has(page: pathlib.Path) -> None:
    flags = _flags()
    wrong = [(flag, value, _default_text(flags[flag])) for flag, value in stated_defaults(page.read_text())
             if flag in flags and not agrees(flags[flag], value)]
    assert not wrong, f"{page.name} states defaults the code does not have (flag, stated, actual): {wrong}"


def test_a_wrong_default_in_a_page_is_found() -> None:
    """The check itself: a sentence that gets a default wrong is caught, a right one is not."""
    flags = _flags()
    found = stated_defaults("`--spin-us` (`ASERVE_SPIN_US`, default 150) and `--log-level` (default `info`).")
    assert found == [("--spin-us", "150"), ("--log-level", "info")]
    assert [agrees(flags[f], v) for f, v in found] == [False, True]
