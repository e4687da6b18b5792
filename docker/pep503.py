"""Writes a PEP 503 "simple" index of a folder of wheels: docker/image.sh serves one for the
image build where PyTorch's own index cannot be reached.

    python docker/pep503.py FILES INDEX    # INDEX/index.html and INDEX/<project>/index.html,
                                           # linking ../../<FILES' name>/<wheel>#sha256=...
"""

from __future__ import annotations

import hashlib
import html
import pathlib
import re
import sys


def project(wheel: str) -> str:
    """The normalized project name of a wheel's file name (PEP 427 / PEP 503)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def write_index(files: pathlib.Path, index: pathlib.Path) -> dict[str, list[str]]:
    projects: dict[str, list[str]] = {}
    for wheel in sorted(files.glob("*.whl")):
        projects.setdefault(project(wheel.name), []).append(wheel.name)
    if not projects:
        raise SystemExit(f"no wheels in {files}")

    def page(title: str, links: list[str]) -> str:
        body = "\n".join(links)
        return f"<!DOCTYPE html>\n<html><head><title>{title}</title></head><body>\n{body}\n</body></html>\n"

    index.mkdir(parents=True, exist_ok=True)
    (index / "index.html").write_text(
        page("Simple index", [f'<a href="{name}/">{name}</a>' for name in sorted(projects)]))
    for name, wheels in projects.items():
        (index / name).mkdir(exist_ok=True)
        links = [f'<a href="../../{files.name}/{html.escape(w)}#sha256={sha256(files / w)}">{html.escape(w)}</a>'
                 for w in wheels]
        (index / name / "index.html").write_text(page(f"Links for {name}", links))
    return projects


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    found = write_index(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]))
    print(f"index of {sum(map(len, found.values()))} wheels: {', '.join(sorted(found))}", file=sys.stderr)
