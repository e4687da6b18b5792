"""What of an error message the outside may see: no absolute paths, no tracebacks.

Messages about models name their files (a config error, a failed import), and the
exceptions models raise carry whatever the model put in them. Before such a text goes
into a response, `Redactor.text` makes paths under the model repository relative to it
(`simple/config.toml`), shortens every other absolute file path to its last part
(`…/weights.pt`) and cuts tracebacks off: the log keeps them whole. URL paths of the
server's own API (`/v2/...`, `/v1/...`, `/metrics`) are left alone.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable
from typing import Any

TRACEBACK = "Traceback (most recent call last):"

# An absolute path: a "/" not preceded by a name, URL or path character, followed by
# at least two components; the server's own URL paths are not paths.
_PATH = re.compile(r"(?<![\w.:/~\]\)>-])/(?!v[12]\b|metrics\b)(?:[^\s'\"`:,;()\[\]{}<>|]+/)+[^\s'\"`:,;()\[\]{}<>|/]*")


def cut_traceback(text: str) -> str:
    """`text` without a traceback (and what follows it), stripped."""
    head, found, _ = text.partition(TRACEBACK)
    return head.strip() if found else text.strip()


class Redactor:
    """Rewrites texts for responses; `roots` maps absolute folders to what replaces them
    ("" for the repository itself: its paths become relative)."""

    __slots__ = ("_roots",)

    def __init__(self, repository: str | os.PathLike[str] | None = None) -> None:
        self._roots: list[tuple[str, str]] = []
        if repository is not None:
            self.add(repository, "")

    def add(self, folder: str | os.PathLike[str], replacement: str) -> None:
        """Paths under `folder` (as given, absolute, or with links resolved) become
        relative to `replacement` (a relative name, "" for none)."""
        path = pathlib.Path(folder)
        for form in {str(path), os.path.abspath(path), os.path.realpath(path)}:
            form = form.rstrip("/")
            if form not in ("", ".", "..") and (form, replacement) not in self._roots:
                self._roots.append((form, replacement))
        self._roots.sort(key=lambda r: len(r[0]), reverse=True)  # the longest (innermost) first

    @property
    def roots(self) -> list[tuple[str, str]]:
        """(folder, what replaces it) pairs, for a Redactor elsewhere (`extend`)."""
        return list(self._roots)

    def extend(self, folders: Iterable[tuple[str, str]]) -> None:
        for folder, replacement in folders:
            self.add(folder, replacement)

    def text(self, text: str) -> str:
        """`text` fit for a response: tracebacks cut, paths relative or shortened."""
        text = cut_traceback(text)
        if "/" not in text:
            return text
        for root, replacement in self._roots:
            if root in text:
                text = _replace_root(text, root, replacement)
        return _PATH.sub(_shorten, text)

    def value(self, value: Any) -> Any:
        """Every string in a JSON-like value (dicts, lists) passed through `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(v) for v in value]
        return value


def _replace_root(text: str, root: str, replacement: str) -> str:
    def sub(m: re.Match[str]) -> str:
        rest = m.group(1) or ""
        if not replacement:
            return rest.lstrip("/") or "."
        return replacement + rest

    return re.sub(r"(?<![\w./-])" + re.escape(root) + r"(/[^\s'\"`:,;()\[\]{}<>|]*)?(?![\w.-])", sub, text)


def _shorten(m: re.Match[str]) -> str:
    last = m.group(0).rstrip("/").rsplit("/", 1)[-1]
    return f"…/{last}" if last else "…"
