"""Deployment files (docker/, loadtests/, deploy/) checked without a container engine or a cluster.

No test here builds or runs the image: they read the Dockerfile, the compose file and
the Prometheus and Grafana configuration and check that they agree with each other and
with the project (ports, names, pins, metric names), and they run the Grafana
dashboard's metric names and the Locust scenario against a real server on loopback.
The Kubernetes files (deploy/) are validated against Kubernetes', KServe's and Prometheus
Operator's schemas and rendered by Helm's engine (test_k8s.py); the server side they rely
on, KServe's model mount and the drain, runs real servers (test_k8s_serve.py).
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field

import pytest
import yaml

# the real-server fixtures of the server tests (a server on 127.0.0.1, an HTTP session)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DEPLOY = ROOT / "deploy"  # Kubernetes: kserve/ (runtimes, InferenceService, CRD schemas), helm/ (the chart)


@dataclass
class Stage:
    """One build stage of a Dockerfile: its base, name and instructions (upper-cased keyword, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # ARG defaults, global and per stage
    stages: list[Stage]

    def expand(self, text: str) -> str:
        """`$NAME` / `${NAME}` replaced by ARG defaults (left as they are when unknown)."""
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: self.args.get(m[1] or m[2], m[0]), text)

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions with their line continuations joined and comment lines dropped, as Docker reads them."""
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not current):
            continue  # comments, also inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    assert not current, "the Dockerfile ends inside a line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG":
            name, eq, default = rest.partition("=")
            if eq:
                args[name.strip()] = default.strip().strip('"')
        if keyword == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, f"cannot read FROM {rest!r}"
            stages.append(Stage(base=m[1], name=m[2]))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
        else:
            assert keyword == "ARG", f"{keyword} before the first FROM"
    return Dockerfile(args, stages)


@pytest.fixture(scope="session")
def dockerfile() -> Dockerfile:
    return parse_dockerfile((DOCKER / "Dockerfile").read_text())


@pytest.fixture(scope="session")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def published(service: dict) -> dict[int, int]:
    """{container port: host port} of a compose service's `ports` ("HOST:CONTAINER" strings)."""
    out: dict[int, int] = {}
    for entry in service.get("ports", ()):
        host, _, container = str(entry).rpartition(":")
        out[int(container.split("/")[0])] = int(host)
    return out


def container_ports(service: dict) -> set[int]:
    """Ports a service listens on inside the compose network: published and `expose`d ones."""
    return set(published(service)) | {int(str(p).split("/")[0]) for p in service.get("expose", ())}
